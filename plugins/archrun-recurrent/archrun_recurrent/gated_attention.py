"""Gated attention (Qwen3-Next's full-attention layers): causal attention whose output is scaled by
a per-channel sigmoid gate that the query projection also produces.

attn_q h gives, per head, [q (hd) | gate (hd)] (llama.cpp src/models/qwen3next.cpp build_layer_attn,
HF modeling_qwen3_next.py Qwen3NextAttention); the attention itself is the usual causal one (its
Q/K norms, rope and cache are the interpreter's), and

    out = attn_output(attention(q, k, v) * sigmoid(gate))          [n, H hd] -> [n, d]

The layout (archrun.vocab.AttentionLayout) splits the gate off in `qkv` and applies it in `o`; a
block calls the two in order on the same rows, so the bound pair hands the gate over. The fast op's layer
decodes fused (`fused_layer`: archrun_recurrent.kernels.gated_attention_layer, with a dense FFN or a mixture
of experts), from the matrices the bound pair names (`qkv.gated_query`, `o.matrix`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

F32 = np.float32


def _gate_numpy(a: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """a * sigmoid(gate) (the reference)."""
    return (a * (1.0 / (1.0 + np.exp(-gate)))).astype(F32)


def _gating(binder: Any):
    """The output gate's function of the bound small ops' backend: numpy on the reference, else the fused
    layer's own element loop (archrun_recurrent.kernels.gated_attention_layer.gate_rows), so a token has the same
    bits op by op and fused (numpy's vector exp rounds apart from the kernel's)."""
    if binder.op_backend == "reference":
        return _gate_numpy
    from archrun_recurrent.kernels.gated_attention_layer import gate_rows

    def gated(a: np.ndarray, gate: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(a, F32).reshape(-1, a.shape[-1])
        return gate_rows(rows, np.ascontiguousarray(gate, F32).reshape(rows.shape)).reshape(a.shape)

    return gated


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
        gated = _gating(binder)

        def qkv(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            qg = wq(h).reshape(len(h), heads, 2, hd)                         # per head [q | gate]
            held[:] = [np.ascontiguousarray(qg[:, :, 1].reshape(len(h), heads * hd))]
            return np.ascontiguousarray(qg[:, :, 0].reshape(len(h), heads * hd)), wk(h), wv(h)

        def o(a: np.ndarray) -> np.ndarray:
            return wo(gated(a, held.pop()))

        # what the fused layer (`fused_layer`) reads: the query group, k, v, whether the gate follows every
        # query (False: per head [q | gate]), the output matrix
        qkv.gated_query, qkv.gate_after, o.matrix = (wq, wk, wv), False, wo
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
        gated = _gating(binder)

        def qkv(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            held[:] = [wg(h)]
            return wq(h), wk(h), wv(h)

        def o(a: np.ndarray) -> np.ndarray:
            return wo(gated(a, held.pop()))

        # the fused layer's query group is attn_q | attn_gate: [q (all heads) | gate (all heads)]
        qkv.gated_query, qkv.gate_after, o.matrix = ((wq, wg), wk, wv), True, wo
        return qkv, o


def gated_reference(spec: Any) -> Any:
    """The attention itself: archrun-blocks' causal attention (reference)."""
    from archrun_blocks import reference

    return reference.CausalAttention(spec)


def fused_layer(op: Any, qkv: Any, o: Any, common: Any, moe: Any, group_id: Any = None) -> tuple | None:
    """(kernel, args, parallel) of a gated attention layer's decode step (archrun.kernels.decode.fusion's
    fuse_attention_layer), either layout's (the gate in the query projection or a projection of its own), or
    None when it runs op by op: another layout's projections (no `gated_query`), an
    attention without a kernel part, a matrix not prepared for the fast kernels, a mixture of experts without
    kernel arguments."""
    from archrun.kernels.decode.parts import usable
    from archrun_recurrent.fused import moe_arguments, product_groups
    from archrun_recurrent.kernels import gated_attention_layer as k

    mats, wo = getattr(qkv, "gated_query", None), getattr(o, "matrix", None)
    part = None if op.fused is None else usable(op.fused, "attention")
    if mats is None or wo is None or part is None:
        return None
    query, wk, wv = mats
    made = product_groups((query, (wk, wv), wo), group_id)
    if made is None:
        return None
    groups, gids, big = made
    ffn = moe_arguments(moe, group_id)
    if ffn is None:
        return None
    moe_args, moe_big = ffn
    return (k.gated_attention_layer, (common, *groups, part.handle, part.params, gids, qkv.gate_after, moe_args),
            big or moe_big)


def gated_fast(spec: Any) -> Any:
    """The attention itself: archrun-blocks' causal attention (fast), whose layer decodes fused with its gate
    (`fused_layer`) when its projections are gated_causal's."""
    from functools import partial

    from archrun_blocks import fast

    op = fast.causal_attention(spec)
    op.fused_layer = partial(fused_layer, op) if op.fused is not None else None
    return op
