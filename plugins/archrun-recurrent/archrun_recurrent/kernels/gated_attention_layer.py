"""A gated attention layer's decode step as one kernel (archrun_recurrent.gated_attention's `fused_layer`: Qwen3-Next's
and Qwen3.5's full-attention layers, whose query projection also yields a sigmoid gate on the output, and AFMoE's,
whose gate is a projection of its own).

The block around the attention (pre-norm; post-norm, dense FFN or mixture of experts, residual joins) is the
core's (archrun.kernels.decode.layer `mixer_input`) and the shared tail's (block_tail); the attention
itself is the op's attention part (archrun-blocks' causal attention, called as the fused decode path calls it), its
Q/K norms and rope the block's parts. The step: q | gate (per head) = attn_q h (or q = attn_q h, gate =
attn_gate h, one product group), k | v = attn_k h | attn_v h; q and
k through their norms (per head when the norm's width is a head's), then rope; att = attention(q, k, v) (its k/v
stored at the cache row); out = attn_output(att * sigmoid(gate)).

Float flags: archrun.kernels._jit.JIT (nnan, ninf only): every step runs in the order stated.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun.kernels.decode.block import product_group
from archrun_recurrent.kernels.block_tail import block_tail
from archrun_recurrent.kernels.delta_step import _sigmoid

_F32 = np.float32
_STEP = dict(JIT, inline="always")


@njit(**_STEP)
def _norm_heads(norm, p, v, w, width):  # pragma: no cover - compiled
    """v in place through the norm part, per segment of w's width (a head's, or all heads' at once)."""
    none = np.empty(0, _F32)
    for s in range(v.shape[0] // width):
        seg = v[s * width:(s + 1) * width]
        norm[0](p, seg, w, none, seg)


@njit(**_STEP)
def _gate(att, gate):  # pragma: no cover - compiled
    """att [m] in place: att * sigmoid(gate), element by element."""
    for i in range(att.shape[0]):
        att[i] = att[i] * _sigmoid(gate[i])


@njit(**JIT)
def gate_rows(att, gate):  # pragma: no cover - compiled
    """att * sigmoid(gate) of rows [n, m] (f32), a new array: the op-by-op path's gate (the gated layouts' `o` on
    the fast backend), the fused step's bits."""
    out = att.copy()
    for r in range(out.shape[0]):
        _gate(out[r], gate[r])
    return out


@njit(**_STEP)
def _gated_attention(h, q_mat, kv_mat, o_mat, attn, attn_p, gids, gate_after, vecs, geo, fns, params, kc, vc, kpos,
                     ring, row, pos, cos, sin, chunks, par):  # pragma: no cover - compiled
    """The attention's output [d] (before the post-norm) of the normed input h [d]."""
    n_head, n_kv, hd, vd = geo[layer.G_HEADS], geo[layer.G_KV], geo[layer.G_HD], geo[layer.G_VD]
    nq, nk = n_head * hd, n_kv * hd
    qg = np.empty(2 * nq, _F32)
    product_group(par, gids[0], q_mat, h, qg, chunks)
    kv = np.empty(nk + n_kv * vd, _F32)
    product_group(par, gids[1], kv_mat, h, kv, chunks)
    q = np.empty(nq, _F32)
    gate = np.empty(nq, _F32)
    if gate_after:  # [q (all heads) | gate (all heads)]
        q[:] = qg[:nq]
        gate[:] = qg[nq:]
    else:
        for i in range(n_head):  # per head [q (hd) | gate (hd)]
            q[i * hd:(i + 1) * hd] = qg[2 * i * hd:(2 * i + 1) * hd]
            gate[i * hd:(i + 1) * hd] = qg[(2 * i + 1) * hd:(2 * i + 2) * hd]
    k = kv[:nk].copy()
    v = kv[nk:].copy()
    norm, pn = fns[layer.F_NORM], params[layer.P_NORM]
    qw, kw = vecs[layer.V_Q_NORM], vecs[layer.V_K_NORM]
    late = geo[layer.G_QK_LATE]
    if qw.shape[0] and not late:
        _norm_heads(norm, pn, q, qw, qw.shape[0])
        _norm_heads(norm, pn, k, kw, kw.shape[0])
    if geo[layer.G_ROPE]:
        rope, pr = fns[layer.F_ROPE], params[layer.P_ROPE]
        rope[0](pr, q, n_head, hd, cos, sin)
        rope[0](pr, k, n_kv, hd, cos, sin)
    if qw.shape[0] and late:
        _norm_heads(norm, pn, q, qw, qw.shape[0])
        _norm_heads(norm, pn, k, kw, kw.shape[0])
    att = np.empty(n_head * vd, _F32)
    attn[0][0](attn_p, q, k, v, kc, vc, kpos, ring, row, pos, att, par[0], -1)
    _gate(att, gate)
    a = np.empty(h.shape[0], _F32)
    product_group(par, gids[2], o_mat, att, a, chunks)
    return a


@njit(**JIT)
def gated_attention_layer(x, common, q_mat, kv_mat, o_mat, attn, attn_p, gids, gate_after, moe, kc, vc, kpos, ring, row,
                          pos, cos, sin, chunks, par):  # pragma: no cover - compiled
    """One gated attention block on one token; x f32 [d] is updated in place.

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer; fns' rope the
    layer's); q_mat: the product group of attn_q (per head [q | gate]; gate_after: attn_q | attn_gate, every query
    then every gate), kv_mat: attn_k | attn_v, o_mat: attn_output; attn, attn_p: the attention part's handle and
    parameters; gids: their decode pool groups (-1: none); moe: None (a dense FFN) or
    the mixture of experts' moe_rows arguments (block_tail); the cache arguments as
    archrun.kernels.decode.fusion.FusedBlock passes them.
    """
    _, _, vecs, geo, fns, params = common[0]
    h = layer.mixer_input(x, vecs, fns, params)
    a = _gated_attention(h, q_mat, kv_mat, o_mat, attn, attn_p, gids, gate_after, vecs, geo, fns, params, kc, vc, kpos,
                         ring, row, pos, cos, sin, chunks, par)
    block_tail(x, a, h, common, moe, chunks, par)
