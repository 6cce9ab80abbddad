"""A synthetic decoder big enough that its weights dominate a process's memory, written with the real gguf writer
from random Q8_0 blocks (no float32 copy of the weights is ever made, so writing it costs little memory)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from archrun.conformance.synthetic import Quantized, write_gguf

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _q8_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 34]: Q8_0 blocks (an f16 scale, 32 int8 values) of a random weight of ~0.05 rms."""
    blocks = rows * cols // 32
    out = np.empty((blocks, 34), np.uint8)
    out[:, :2] = np.full((blocks, 1), 0.05 / 64, np.float16).view(np.uint8)
    out[:, 2:] = rng.integers(-110, 111, (blocks, 32), dtype=np.int8).view(np.uint8)
    return out.reshape(rows, -1)


def write_big(path: str | Path, *, n_layer: int = 24, n_embd: int = 512, n_ff: int = 1536, n_head: int = 8,
              n_head_kv: int = 8, n_vocab: int = 256, seed: int = 0) -> Path:
    """A qwen3-layout decoder with every matrix in Q8_0 (norms float32); its path."""
    rng = np.random.default_rng(seed)
    hd = n_embd // n_head
    keys = {"context_length": 512, "embedding_length": n_embd, "block_count": n_layer, "feed_forward_length": n_ff,
            "attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "attention.key_length": hd,
            "attention.value_length": hd, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0}
    tensors: dict = {}

    def q8(name: str, rows: int, cols: int) -> None:
        tensors[name] = Quantized(_q8_0(rng, rows, cols), int(Q8_0))

    def norm(name: str, n: int) -> None:
        tensors[name] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q8("token_embd.weight", n_vocab, n_embd)
    norm("output_norm.weight", n_embd)
    q8("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", n_embd)
        norm(p + "ffn_norm.weight", n_embd)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        q8(p + "attn_q.weight", n_head * hd, n_embd)
        q8(p + "attn_k.weight", n_head_kv * hd, n_embd)
        q8(p + "attn_v.weight", n_head_kv * hd, n_embd)
        q8(p + "attn_output.weight", n_embd, n_head * hd)
        q8(p + "ffn_gate.weight", n_ff, n_embd)
        q8(p + "ffn_up.weight", n_ff, n_embd)
        q8(p + "ffn_down.weight", n_embd, n_ff)
    return write_gguf(path, "qwen3", {f"qwen3.{k}": v for k, v in keys.items()}, tensors, n_vocab=n_vocab)
