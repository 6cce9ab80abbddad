"""Gated attention (Qwen3-Next's full-attention layers): causal attention whose output is scaled by
a per-channel sigmoid gate that the query projection also produces.

attn_q h gives, per head, [q (hd) | gate (hd)] (llama.cpp src/models/qwen3next.cpp build_layer_attn,
HF modeling_qwen3_next.py Qwen3NextAttention); the attention itself is the usual causal one (its
Q/K norms, rope and cache are the interpreter's), and

    out = attn_output(attention(q, k, v) * sigmoid(gate))          [n, H hd] -> [n, d]

The layout (archrun.vocab.AttentionLayout) splits the gate off in `qkv` and applies it in `o`; a
block calls the two in order on the same rows, so the bound pair hands the gate over.
"""

from __future__ import annotations

from typing import Any

import numpy as np

F32 = np.float32


class GatedAttentionLayout:
    """describe: the geometry of a gated-query attention layer; bind: its split and gated projections."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        m, t, i, d, heads, kv = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd, ctx.n_head, ctx.n_head_kv
        hd = m.get("attention.key_length", int, d // heads)
        t.expect("attn_q", i, (d, 2 * heads * hd))
        t.expect("attn_k", i, (d, kv * hd))
        t.expect("attn_v", i, (d, kv * hd))
        t.expect("attn_output", i, (heads * hd, d))
        qk_norm = t.has("attn_q_norm", i)
        if qk_norm:
            t.expect("attn_q_norm", i, (hd,))
            t.expect("attn_k_norm", i, (hd,))
        return {"n_head_kv": kv, "head_dim": hd, "v_head_dim": hd, "qk_norm": qk_norm}

    def bind(self, binder: Any, spec: Any, layer: int) -> tuple[Any, Any]:
        """(qkv, o): qkv(h) -> (q, k, v) keeping the gate; o(a) -> attn_output(a * sigmoid(gate))."""
        wq, wk, wv = (binder.matrix(r, layer) for r in ("attn_q", "attn_k", "attn_v"))
        wo = binder.matrix("attn_output", layer)
        heads, hd = spec.n_head, spec.head_dim
        held: list[np.ndarray] = []

        def qkv(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            qg = wq(h).reshape(len(h), heads, 2, hd)                         # per head [q | gate]
            held[:] = [np.ascontiguousarray(qg[:, :, 1].reshape(len(h), heads * hd))]
            return np.ascontiguousarray(qg[:, :, 0].reshape(len(h), heads * hd)), wk(h), wv(h)

        def o(a: np.ndarray) -> np.ndarray:
            gate = held.pop()
            return wo((a * (1.0 / (1.0 + np.exp(-gate)))).astype(F32))

        return qkv, o


class GateProjAttentionLayout:
    """describe/bind of causal attention gated by its own projection (AFMoE / Trinity: HF
    AfmoeAttention's gate_proj, llama.cpp src/models/afmoe.cpp `attn_gate`):

        out = attn_output(attention(q, k, v) * sigmoid(attn_gate h))          [n, H hd] -> [n, d]
    """

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        m, t, i, d, heads, kv = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd, ctx.n_head, ctx.n_head_kv
        hd = m.get("attention.key_length", int, d // heads)
        for role, shape in (("attn_q", (d, heads * hd)), ("attn_k", (d, kv * hd)), ("attn_v", (d, kv * hd)),
                            ("attn_gate", (d, heads * hd)), ("attn_output", (heads * hd, d))):
            t.expect(role, i, shape)
        qk_norm = t.has("attn_q_norm", i)
        if qk_norm:
            t.expect("attn_q_norm", i, (hd,))
            t.expect("attn_k_norm", i, (hd,))
        return {"n_head_kv": kv, "head_dim": hd, "v_head_dim": hd, "qk_norm": qk_norm}

    def bind(self, binder: Any, spec: Any, layer: int) -> tuple[Any, Any]:
        """(qkv, o): qkv(h) -> (q, k, v) keeping attn_gate h; o(a) -> attn_output(a * sigmoid(gate))."""
        wq, wk, wv, wg = (binder.matrix(r, layer) for r in ("attn_q", "attn_k", "attn_v", "attn_gate"))
        wo = binder.matrix("attn_output", layer)
        held: list[np.ndarray] = []

        def qkv(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            held[:] = [wg(h)]
            return wq(h), wk(h), wv(h)

        def o(a: np.ndarray) -> np.ndarray:
            gate = held.pop()
            return wo((a * (1.0 / (1.0 + np.exp(-gate)))).astype(F32))

        return qkv, o


def gated_reference(spec: Any) -> Any:
    """The attention itself: archrun-blocks' causal attention (reference)."""
    from archrun_blocks import reference

    return reference.CausalAttention(spec)


def gated_fast(spec: Any) -> Any:
    """The attention itself: archrun-blocks' causal attention (fast; the layer runs op by op)."""
    from archrun_blocks import fast

    return fast.causal_attention(spec)
