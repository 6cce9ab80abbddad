"""Embeddings: a model's final hidden states pooled into one vector per text (`archrun.embed`).

Pooling follows llama.cpp's `llama_pooling_type`, which a file states in `<arch>.pooling_type`
(Descriptor.pooling): "mean" averages the positions' hidden states, "cls" takes the first
position's (BERT's [CLS]), "last" the last position's (decoder embedders such as Qwen3-Embedding).
"none" (what decoder-only files state, by saying nothing) keeps one vector per token, which is not
one embedding per text: like llama-server's /v1/embeddings, `embed` then refuses unless the caller
names a pooling (llama-server's `--pooling`). "rank" is a reranker's classifier head on the [CLS]
state, which archrun does not run (refused by name). With `normalize` each vector is scaled to unit
Euclidean length (llama.cpp's default `embd_normalize` 2), so a dot product is the cosine.

Texts are tokenized as llama-server tokenizes embedding inputs: with the vocabulary's special
tokens added (BOS where the file asks for it; BERT's [CLS] ... [SEP]), never parsing special-token
text inside the input. An encoder runs each text in one pass; a decoder through its prefill path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from archrun.errors import ContextOverflow, InvalidRequest, check_flag, shown

F32 = np.float32
POOLINGS = ("mean", "cls", "last")  # what `embed` computes; the file may also state "none" or "rank"
MAX_INPUTS = 2048  # texts per call (OpenAI's limit for one embeddings request)


def embed(model: Any, texts: str | Sequence[str] | Sequence[Sequence[int]], *, pooling: str | None = None,
          normalize: bool = True) -> np.ndarray:
    """float32 [n, d]: one embedding per text (a str, a list of str, a list of token-id lists, or one list of
    token ids), pooled as the file states or as `pooling` ("mean", "cls", "last") says, unit length when
    `normalize`. InvalidRequest for inputs that are none of those or empty, for a file stating pooling
    "none" without a `pooling`, or "rank"; ContextOverflow for a text longer than the context."""
    return embed_ids(model, token_lists(model, texts), pooling=pooling, normalize=normalize)


def token_lists(model: Any, texts: Any) -> list[list[int]]:
    """The token ids of each input (see `embed`), tokenized with the vocabulary's special tokens."""
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, np.ndarray) and texts.ndim in (1, 2):
        texts = texts.tolist()
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Sequence):
        raise InvalidRequest(f"texts must be a str, a list of str or a list of token-id lists, got {shown(texts)}")
    if len(texts) == 0 or len(texts) > MAX_INPUTS:
        raise InvalidRequest(f"texts must hold 1 to {MAX_INPUTS} inputs, got {len(texts)}")
    if all(_is_int(t) for t in texts):  # one text given as token ids
        return [[int(t) for t in texts]]
    out = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            out.append(_tokenizer(model).encode(text, add_special=True))
        elif isinstance(text, Sequence) and not isinstance(text, (bytes, bytearray)) and all(map(_is_int, text)):
            out.append([int(t) for t in text])
        else:
            raise InvalidRequest(f"input {i} must be a str or a list of token ids, got {shown(text)}")
        if not out[-1]:
            raise InvalidRequest(f"input {i} has no tokens")
    return out


def embed_ids(model: Any, sequences: Sequence[Sequence[int]], *, pooling: str | None = None,
              normalize: bool = True) -> np.ndarray:
    """float32 [n, d]: the pooled (and normalized) final hidden states of each token-id sequence."""
    how = pooling_of(model, pooling)
    normalize = check_flag("normalize", normalize)
    for i, ids in enumerate(sequences):  # every input is checked before any of them runs
        if len(ids) > model.descriptor.n_ctx:
            raise ContextOverflow(f"input {i} has {len(ids)} tokens, more than the context length "
                                  f"{model.descriptor.n_ctx}")
        model._check_ids(ids)
    out = np.stack([pool(model.hidden_states(ids), how) for ids in sequences]).astype(F32)
    return l2_normalized(out) if normalize else out


def pooling_of(model: Any, pooling: str | None = None) -> str:
    """The pooling `embed` applies to `model`: `pooling` when given, else the file's; InvalidRequest for
    "none" (no single vector per text), "rank" (a classifier head archrun does not run) or another name."""
    if not callable(getattr(model, "hidden_states", None)):
        raise InvalidRequest(f"model must be a model archrun.load returned, got {type(model).__name__}")
    stated = model.descriptor.pooling
    if pooling is not None and not isinstance(pooling, str):
        raise InvalidRequest(f"pooling must be one of {', '.join(POOLINGS)} or None, got {shown(pooling)}")
    if pooling is None:
        if stated == "none":
            raise InvalidRequest(f"{model.descriptor.architecture}: the file states no pooling (one vector per "
                                 f"token); name one: pooling={' | '.join(map(repr, POOLINGS))}")
        pooling = stated
    if pooling == "rank":
        raise InvalidRequest("rank pooling (a reranker's classifier head) is not supported; embed with "
                             f"pooling={' | '.join(map(repr, POOLINGS))}")
    if pooling not in POOLINGS:
        raise InvalidRequest(f"pooling must be one of {', '.join(POOLINGS)}, got {shown(pooling)}")
    return pooling


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """hidden [n, d] -> [d]: the mean over positions, the first position's (cls) or the last's."""
    if pooling == "mean":
        return hidden.mean(axis=0, dtype=np.float64).astype(F32)
    return hidden[0] if pooling == "cls" else hidden[-1]


def l2_normalized(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean length (a zero row stays zero, as llama.cpp's common_embd_normalize)."""
    norms = np.sqrt(np.square(x.astype(np.float64)).sum(axis=-1, keepdims=True))
    return (x / np.where(norms > 0, norms, 1.0)).astype(F32)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _tokenizer(model: Any) -> Any:
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidRequest("this model's file carries no tokenizer: give token ids instead of text")
    return tok
