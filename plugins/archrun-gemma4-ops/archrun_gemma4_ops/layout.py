"""Gemma 4's attention projections (an archrun.vocab.AttentionLayout).

llama.cpp src/models/gemma4-iswa.cpp, HF modeling_gemma4.py (Gemma4TextAttention), per layer:

    q = norm(attn_q h, attn_q_norm)    [H, hd]   (then rope, the interpreter's)
    k = norm(attn_k h, attn_k_norm)    [KV, hd]  (then rope)
    v = rms(attn_v h)                  [KV, hd]  an RMS norm without weight; without attn_v
                                                 (HF attention_k_eq_v) v = rms of the same raw k
    scores = q . k                     unscaled: the q/k norms fix the magnitude (HF scaling = 1.0)

hd is the layer kind's width: `attention.key_length_swa` on sliding layers (the file's
`attention.sliding_window_pattern`), `attention.key_length` on the others; the KV heads are the
file's per-layer `attention.head_count_kv`. The q/k norms are the layout's (not the interpreter's)
because the last `attention.shared_kv_layers` layers have no k projection or k norm: they reuse
the keys and values of the last earlier layer of their kind (`params["kv_source"]`, see
archrun_gemma4_ops.attention), and their k and v here are zeros the attention op ignores.
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


def kv_source(meta: Any, sliding: list[bool], i: int) -> int:
    """The layer whose keys and values layer i reuses (the last earlier layer of its kind that
    computes its own, HF kv_sharing_modes), or -1 when layer i computes its own."""
    n = len(sliding)
    shared = meta.get("attention.shared_kv_layers", int, 0)
    if not 0 <= shared < n:
        raise MetadataError(f"{meta.key('attention.shared_kv_layers')!r} = {shared}: it must leave a layer "
                            f"of the {n} computing its own keys")
    first = n - shared
    if i < first:
        return -1
    same = [j for j in range(first) if sliding[j] == sliding[i]]
    if not same:
        raise MetadataError(f"layer {i} reuses the keys of an earlier {'sliding' if sliding[i] else 'full'} "
                            "layer, but no layer of that kind computes its own")
    return same[-1]


class Gemma4Layout:
    """describe: the layer's geometry by its kind; bind: q, k and normed v (module docstring)."""

    kind = "gemma4"  # the attention op this layout belongs to (messages)

    def widths(self, meta: Any, sliding: bool) -> tuple[int, int, str]:
        """(key width, value width, the key suffix they were read with) of a layer of this kind."""
        suffix = "_swa" if sliding else ""
        hd = meta.get(f"attention.key_length{suffix}", int)
        return hd, meta.get(f"attention.value_length{suffix}", int, hd), suffix

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        m, t, i, d, n_head, n_kv = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd, ctx.n_head, ctx.n_head_kv
        sliding = sliding_layers(m, i)
        hd, vd, suffix = self.widths(m, sliding[i])
        if vd != hd or hd < 1:
            raise MetadataError(f"layer {i}: attention {self.kind!r} needs equal key and value widths "
                                f"(key_length{suffix} {hd}, value_length{suffix} {vd})")
        source = kv_source(m, sliding, i)
        t.expect("attn_q", i, (d, n_head * hd))
        t.expect("attn_q_norm", i, (hd,))
        t.expect("attn_output", i, (n_head * hd, d))
        if source < 0:
            t.expect("attn_k", i, (d, n_kv * hd))
            t.expect("attn_k_norm", i, (hd,))
            if t.has("attn_v", i):
                t.expect("attn_v", i, (d, n_kv * hd))
        return dict(n_head_kv=n_kv, head_dim=hd, v_head_dim=hd, scale=1.0,
                    params={"k_eq_v": float(source < 0 and not t.has("attn_v", i)), "kv_source": float(source)})

    def bind(self, b: Any, spec: Any, i: int) -> tuple[Any, Any]:
        """(qkv, o) of layer i."""
        norm = b.op("norm", b.d.norm, b.d.norm_eps)
        q = (b.matrix("attn_q", i), b.vector("attn_q_norm", i))
        if spec.param("kv_source") >= 0:
            qkv = Gemma4Qkv(q, None, None, norm, spec)
        else:
            v = None if spec.param("k_eq_v") else b.matrix("attn_v", i)
            qkv = Gemma4Qkv(q, (b.matrix("attn_k", i), b.vector("attn_k_norm", i)), v, norm, spec)
        return qkv, b.matrix("attn_output", i)


class Gemma4Qkv:
    """h [n, d] -> norm(q) [n, H hd], norm(k) [n, KV hd], rms(v) [n, KV hd] (v from k's raw product
    without attn_v; k and v zeros on a layer that reuses another's)."""

    def __init__(self, q: tuple[Any, np.ndarray], k: tuple[Any, np.ndarray] | None, v: Any | None, norm: Any,
                 spec: Any):
        self.q, self.k, self.v, self.norm = q, k, v, norm
        self.hd, self.kv_width = spec.head_dim, spec.n_head_kv * spec.head_dim
        self.unit = np.ones(spec.head_dim, F32)

    def _heads(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        n = len(x)
        return self.norm(np.ascontiguousarray(x, dtype=F32).reshape(n, -1, self.hd), w).reshape(n, -1)

    def __call__(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = self._heads(self.q[0](h), self.q[1])
        if self.k is None:
            zeros = np.zeros((len(h), self.kv_width), F32)
            return q, zeros, zeros
        raw = self.k[0](h)
        v = raw if self.v is None else self.v(h)
        return q, self._heads(raw, self.k[1]), self._heads(v, self.unit)
