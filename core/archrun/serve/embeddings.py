"""POST /v1/embeddings in OpenAI's shape, on archrun.generation.embedding.

A body {"input": str | [str] | [int] | [[int]], "encoding_format": "float" | "base64",
"dimensions": d (optional; only the model's own width), "model": ...} is answered
{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] or base64 of the
float32 little-endian bytes}], "model", "usage": {"prompt_tokens", "total_tokens"}}. Vectors are
pooled as the file states, or as `archrun serve --pooling` says (llama-server's `--pooling`; a
decoder file states none: without the flag such a server answers 400, as llama-server does), and
normalized to unit length. Every input is tokenized and checked (ids in range, lengths within the
context, the batch within MAX_TOKENS) before any is computed; bad input is a 400.

The pass runs on a worker thread beside the inference thread (one embedding batch at a time): a
whole sequence through the model's prefill path, sharing no cache with the generating requests.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import numpy as np

from archrun.errors import InvalidRequest, shown
from archrun.generation import embedding

ENCODINGS = ("float", "base64")
MAX_TOKENS = 1 << 16  # tokens of all inputs of one request (past it: 400; split the batch)


class Embedder:
    """A model's /v1/embeddings: parse, tokenize and check a body, compute, answer."""

    def __init__(self, model: Any, model_id: str, pooling: str | None = None):
        self.model, self.model_id, self.pooling = model, model_id, pooling
        self._lock = threading.Lock()  # one embedding batch at a time

    def parse(self, body: dict[str, Any]) -> tuple[list[list[int]], str]:
        """(token ids of each input, encoding format); InvalidRequest for anything OpenAI's API refuses."""
        if "input" not in body:
            raise InvalidRequest("'input' is required: a string, a list of strings, or token ids")
        fmt = body.get("encoding_format", "float")
        if fmt is None:
            fmt = "float"
        if fmt not in ENCODINGS:
            raise InvalidRequest(f"encoding_format must be one of {', '.join(ENCODINGS)}, got {shown(fmt)}")
        dims = body.get("dimensions")
        width = self.model.descriptor.n_embd
        if dims is not None and (isinstance(dims, bool) or dims != width):
            raise InvalidRequest(f"dimensions must be this model's width {width} (archrun does not shorten "
                                 f"embeddings), got {shown(dims)}")
        inputs = body["input"]
        texts = [inputs] if isinstance(inputs, str) else inputs
        if isinstance(texts, list) and any(isinstance(t, str) and not t for t in texts):
            raise InvalidRequest("an input string is empty")
        embedding.pooling_of(self.model, self.pooling)  # refused before tokenizing: no pooling to apply
        ids = embedding.token_lists(self.model, inputs)
        total = sum(len(s) for s in ids)
        if total > MAX_TOKENS:
            raise InvalidRequest(f"the inputs hold {total} tokens, more than {MAX_TOKENS} per request")
        return ids, fmt

    def compute(self, ids: list[list[int]]) -> np.ndarray:
        """float32 [n, d], unit length (worker thread)."""
        with self._lock:
            return embedding.embed_ids(self.model, ids, pooling=self.pooling)

    def answer(self, ids: list[list[int]], vectors: np.ndarray, fmt: str) -> dict[str, Any]:
        """The response body."""
        def encoded(v: np.ndarray) -> Any:
            if fmt == "base64":
                return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")
            return [float(x) for x in v]

        n = sum(len(s) for s in ids)
        return {"object": "list", "model": self.model_id,
                "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}
