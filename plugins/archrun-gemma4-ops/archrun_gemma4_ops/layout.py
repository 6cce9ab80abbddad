"""Gemma 4's attention projections (an archrun.vocab.AttentionLayout).

llama.cpp src/models/gemma4-iswa.cpp, HF modeling_gemma4.py (Gemma4TextAttention), per layer:

    q = attn_q h            [H, hd]      (then the q norm and rope, the interpreter's)
    k = attn_k h            [KV, hd]     (then the k norm and rope)
    v = rms(attn_v h)       [KV, hd]     an RMS norm without weight; without attn_v
                                         (HF attention_k_eq_v) v = rms(k) from the same raw k
    scores = q . k          unscaled: the q/k norms fix the magnitude (HF scaling = 1.0)

hd is the layer kind's width: `attention.key_length_swa` on sliding layers (the file's
`attention.sliding_window_pattern`), `attention.key_length` on the others; the KV heads are the
file's per-layer `attention.head_count_kv`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from archrun.errors import MetadataError

F32 = np.float32


def sliding_layers(meta: Any, n_layer_hint: int) -> list[bool]:
    """The file's per-layer sliding flags (`attention.sliding_window_pattern`, a bool per layer)."""
    key = meta.key("attention.sliding_window_pattern")
    pattern = meta.gguf.metadata.get(key)
    if pattern is None or isinstance(pattern, (int, np.integer)) or len(pattern) <= n_layer_hint:
        raise MetadataError(f"{key!r} must hold a flag per layer: attention 'gemma4' reads each layer's kind")
    return [bool(x) for x in pattern]


class Gemma4Layout:
    """describe: the layer's geometry by its kind; bind: q, k and normed v (module docstring)."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        m, t, i, d, n_head, n_kv = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd, ctx.n_head, ctx.n_head_kv
        swa = sliding_layers(m, i)[i]
        suffix = "_swa" if swa else ""
        hd = m.get(f"attention.key_length{suffix}", int)
        vd = m.get(f"attention.value_length{suffix}", int, hd)
        if vd != hd or hd < 1:
            raise MetadataError(f"layer {i}: attention 'gemma4' needs equal key and value widths "
                                f"(key_length{suffix} {hd}, value_length{suffix} {vd})")
        t.expect("attn_q", i, (d, n_head * hd))
        t.expect("attn_k", i, (d, n_kv * hd))
        if t.has("attn_v", i):
            t.expect("attn_v", i, (d, n_kv * hd))
        t.expect("attn_q_norm", i, (hd,))
        t.expect("attn_k_norm", i, (hd,))
        t.expect("attn_output", i, (n_head * hd, d))
        return dict(n_head_kv=n_kv, head_dim=hd, v_head_dim=hd, scale=1.0, qk_norm=True,
                    params={"k_eq_v": float(not t.has("attn_v", i))})

    def bind(self, b: Any, spec: Any, i: int) -> tuple[Any, Any]:
        """(qkv, o) of layer i."""
        norm = b.op("norm", b.d.norm, b.d.norm_eps)
        v = None if spec.param("k_eq_v") else b.matrix("attn_v", i)
        return Gemma4Qkv(b.matrix("attn_q", i), b.matrix("attn_k", i), v, norm, spec.head_dim), \
            b.matrix("attn_output", i)


class Gemma4Qkv:
    """h [n, d] -> q [n, H hd], k [n, KV hd], rms(v) [n, KV hd] (v = k's raw product without attn_v)."""

    def __init__(self, q: Any, k: Any, v: Any | None, norm: Any, head_dim: int):
        self.q, self.k, self.v, self.norm = q, k, v, norm
        self.unit = np.ones(head_dim, F32)

    def __call__(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = self.k(h)
        v = k if self.v is None else self.v(h)
        n, hd = len(h), len(self.unit)
        v = self.norm(np.ascontiguousarray(v, dtype=F32).reshape(n, -1, hd), self.unit).reshape(n, -1)
        return self.q(h), k, v.astype(F32, copy=False)
