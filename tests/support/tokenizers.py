"""Tokenizers of the real models and small BPE vocabularies written as metadata."""

from __future__ import annotations

import functools
import pathlib

import numpy as np
import pytest

from archrun.text.tokenizer import Tokenizer

MODEL_DIR = pathlib.Path.home() / ".cache" / "archrun" / "models"
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


@functools.cache
def real_tokenizer(model: str) -> Tokenizer:
    """Tokenizer of a real model (built once per test session); skips when the file is absent."""
    path = MODEL_DIR / MODELS[model]
    if not path.exists():
        pytest.skip(f"{path.name} not downloaded (scripts/fetch_models.py {model})")
    return Tokenizer.from_gguf(path)


BYTE_CHARS = __import__("archrun.text.tokenizer.bpe", fromlist=["_BYTE_CHARS"])._BYTE_CHARS
BPE_TOKENS = [*BYTE_CHARS, "Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>", "<tool>"]
SPECIAL_TYPES = {"<|im_start|>": 3, "<|im_end|>": 3, "<tool>": 4}


def bpe_meta(**override) -> dict:
    """A byte-level BPE vocabulary: 256 byte tokens, 'the' merges, control + user-defined tokens.

    Keys set to None in `override` are removed; token types follow the token list unless given.
    """
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": BPE_TOKENS,
        "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he"],
        "tokenizer.ggml.bos_token_id": 259,
        "tokenizer.ggml.eos_token_id": 260,
        **override,
    }
    tokens = meta["tokenizer.ggml.tokens"]
    if "tokenizer.ggml.token_type" not in override and isinstance(tokens, list):
        types = [SPECIAL_TYPES.get(t, 1) if isinstance(t, str) else 1 for t in tokens]
        meta["tokenizer.ggml.token_type"] = np.array(types, dtype=np.int32)
    return {k: v for k, v in meta.items() if v is not None}
