"""A Gemma 4 attention layer's decode step as one kernel call (attention "gemma4"'s fast op: `fused_layer`,
archrun_gemma4_ops.fused).

The op-by-op path's operations for one token (archrun_gemma4_ops.layout, archrun_gemma4_ops.attention), so a
token's result has the same bits either way: q | k | v = attn_q h | attn_k h | attn_v h in one decode product
group (each output row is the same product; without attn_v the values are the raw keys, and a layer that
reuses an earlier layer's keys projects q alone); q and k through the model norm's part per head with their
norm weights, v per head with unit weights (the unweighted RMS norm); then the model's rope part on q and k
and archrun-blocks' causal attention part (unscaled scores: the spec's scale 1), which stores the token's
row and attends. A layer that reuses its source's keys (KV sharing) reads the source's slot, whose row of
this position the source stored earlier in the same step: the part stores that row again as it is (float32
rows: the same bits) and attends over exactly the rows the source attended over. The block around it
(pre-norm, post-norms, dense FFN, residual joins with the layer scalar) is the core's
(archrun.kernels.decode.layer `mixer_input`, `mixer_output`) with the model's parts.

A layer's own arguments `own` (a typed list of one tuple, see archrun_gemma4_ops.fused):
  qkv_mat  product group (attn_q, attn_k, attn_v) (absent ones: no attn_v, or a layer reusing keys)
  o_mat    product group (attn_output, -, -)
  q_norm, k_norm, unit  f32 [hd] (k_norm empty on a layer reusing keys; unit: ones)
  g        int64 G_* fields
  norm, norm_p  the q/k/v norm's part value (fn,) and parameters; attn, attn_p: the attention part's

Float flags: archrun.kernels._jit.JIT (nnan, ninf only): every step runs in the order stated.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import block, layer

_F32 = np.float32
_STEP = dict(JIT, inline="always")
G_HEADS, G_KV, G_HD, G_OWN_KV, G_K_EQ_V, G_GID_QKV, G_GID_O = range(7)


@njit(**JIT)
def product_group(par, gid, ms, x, y, chunks):
    """block.product_group, compiled once and called from each of the layer's products (not inlined at each
    site: a shorter compile; a call costs nothing beside a product)."""
    block.product_group(par, gid, ms, x, y, chunks)


@njit(**_STEP)
def _norm_heads(norm, p, v, w, hd):
    """Each head of v [heads * hd] through the norm part with weight w [hd], in place."""
    none = np.empty(0, _F32)
    for s in range(v.shape[0] // hd):
        seg = v[s * hd:(s + 1) * hd]
        norm[0](p, seg, w, none, seg)


@njit(**JIT)
def gemma4_attention(h, own, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """The attention's output [d] (before the post-norm) of the normed input h [d]; the token's K/V row goes to
    cache row `row` (a layer reusing keys stores its source's row again)."""
    qkv_mat, o_mat, q_norm, k_norm, unit, g, norm, pn, attn, pa = own
    n_head, n_kv, hd = g[G_HEADS], g[G_KV], g[G_HD]
    nq, nk = n_head * hd, n_kv * hd
    own_kv = g[G_OWN_KV] != 0
    width = nq
    if own_kv:
        width += nk if g[G_K_EQ_V] else 2 * nk
    y = np.empty(width, _F32)
    product_group(par, g[G_GID_QKV], qkv_mat, h, y, chunks)
    q = y[:nq].copy()
    _norm_heads(norm, pn, q, q_norm, hd)
    if own_kv:
        k = y[nq:nq + nk].copy()
        v = y[nq:nq + nk].copy() if g[G_K_EQ_V] else y[nq + nk:].copy()
        _norm_heads(norm, pn, k, k_norm, hd)
        _norm_heads(norm, pn, v, unit, hd)
    else:  # the source's row of this position (stored, roped, this step): the part stores it again as it is
        k = kc[row].copy().reshape(kc.shape[1] * kc.shape[2])
        v = vc[row].copy().reshape(vc.shape[1] * vc.shape[2])
    if geo[layer.G_ROPE]:
        rope, pr = fns[layer.F_ROPE], params[layer.P_ROPE]
        rope[0](pr, q, n_head, hd, cos, sin)
        if own_kv:
            rope[0](pr, k, n_kv, hd, cos, sin)
    att = np.empty(nq, _F32)
    attn[0](pa, q, k, v, kc, vc, kpos, ring, row, pos, att, par[0], -1)
    a = np.empty(h.shape[0], _F32)
    product_group(par, g[G_GID_O], o_mat, att, a, chunks)
    return a


@njit(**JIT)
def gemma4_layer(x, common, own, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):  # pragma: no cover - compiled
    """One Gemma 4 attention block with a dense FFN on one token; x f32 [d] is updated in place.

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer; fns' rope the
    layer's, its residual parts residual "gemma4_scaled"'s: the layer scalar joins there); own[0]: the layer's
    projections and parts (module docstring); the cache arguments as archrun.kernels.decode.fusion.FusedBlock
    passes them (the source layer's slot on a layer that reuses its keys).
    """
    gate_up, down, vecs, geo, fns, params = common[0]
    h = layer.mixer_input(x, vecs, fns, params)
    a = gemma4_attention(h, own[0], geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par)
    layer.mixer_output(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par)
