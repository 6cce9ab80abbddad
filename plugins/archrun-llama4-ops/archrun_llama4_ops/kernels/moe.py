"""moe "topk_input_weighted" in numba: routing and the selected experts, the routing weight on each expert's
input (llama4's weight_before_ffn), for n tokens in one call (`moe_rows`), and a whole decode layer with it
(`decode_moe_layer`: the core's attention sub-block and residual joins around it).

The computation is archrun_llama4_ops.ops.topk_input_weighted's, in its order:
1. router logits [n, E] = h @ ffn_gate_inp.T (+ bias), one product group;
2. routing per token by archrun-blocks' `route_rows` (the gating part, then reference.route's choice:
   selection bias, group limit, top-k with its tie order, optional renorm and scale);
3. for each expert in ascending order, the tokens routed to it (ascending) read h[t] * weight, go through
   its gate/up product, the activation part times up, and its down product as one batch, and the outputs
   are added to out[t] as they are (no weight after the FFN);
4. the shared experts run on h itself and are added last (times sigmoid(h . shared_gate) when the weights
   have that gate).

The kernel arrays and pool groups are archrun-blocks' (moe_kernels.moe_arrays, pool_group_ids). Products
go through the core's product groups (kernels.decode.block.pooled_product: 8-bit activation blocks as
kernels.matmul computes few tokens; shared with the running decode pool, each output row still computed
whole by one thread), so the op-by-op path (this kernel over a prompt's or a step's rows) and the fused
layer give the same bits for a token.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels import pages
from archrun.kernels._jit import JIT
from archrun.kernels.decode import block, layer
from archrun_blocks.moe_kernels import (
    GID_EXPERTS,
    GID_ROUTER,
    GID_SHARED_DOWN,
    GID_SHARED_GU,
    RP_K,
    _by_expert,
    _gated_ffn,
    route_rows,
)

_F32 = np.float32
_STEP = dict(JIT, inline="always")


@njit(**JIT)
def moe_rows(h, out, router, experts, shared_gu, shared_down, probs_bias, shared_gate, page_table, page_rows, rp,
             scale, gate_fn, gate_p, act_fn, act_p, gids, chunks, par):
    """out f32 [n, d] = the input-weighted mixture of h f32 [n, d] (C-contiguous). Arguments as
    archrun_blocks.moe_kernels.moe_rows takes them (moe_arrays' arrays, routing parameters rp and scale,
    the gating's and activation's part handles, pool groups gids, chunks, the running pool par)."""
    n, d = h.shape
    n_exp = router[0][block._NOUT]
    k = rp[RP_K]
    logits = np.empty((n, n_exp), _F32)
    block.pooled_product(par, gids[GID_ROUTER], router, h, logits, chunks)
    ids = np.empty((n, k), np.int64)
    wts = np.empty((n, k), _F32)
    route_rows(logits, probs_bias, rp, scale, gate_fn, gate_p, ids, wts)
    out[:] = 0
    start, order = _by_expert(ids, n_exp)
    if page_rows.shape[0]:  # experts streamed from disk: ask for every pick before computing the first
        for e in range(n_exp):
            if start[e + 1] > start[e]:
                for j in range(3):
                    pages.read_ahead(page_table, page_rows[3 * e + j])
    absent = router[1]
    for e in range(n_exp):
        m = start[e + 1] - start[e]
        if m == 0:
            continue
        xe = np.empty((m, d), _F32)
        for i in range(m):
            p = order[start[e] + i]
            w = wts[p // k, p % k]
            src = h[p // k]
            for c in range(d):
                xe[i, c] = src[c] * w
        g0 = gids[GID_EXPERTS] + 2 * e if gids[GID_EXPERTS] >= 0 else -1
        ye = _gated_ffn((experts[3 * e], experts[3 * e + 1], absent), (experts[3 * e + 2], absent, absent),
                        xe, act_fn, act_p, chunks, par, g0, g0 + 1 if g0 >= 0 else -1)
        for i in range(m):
            t = order[start[e] + i] // k
            for c in range(d):
                out[t, c] += ye[i, c]
    if shared_gu[0][block._NOUT]:
        ys = _gated_ffn(shared_gu, shared_down, h, act_fn, act_p, chunks, par, gids[GID_SHARED_GU],
                        gids[GID_SHARED_DOWN])
        for t in range(n):
            s = _F32(1.0)
            if shared_gate.shape[0]:  # sigmoid(h[t] . shared_gate), accumulated in float64
                z = 0.0
                for c in range(d):
                    z += np.float64(h[t, c]) * np.float64(shared_gate[c])
                s = _F32(1.0 / (1.0 + np.exp(-z)))
            for c in range(d):
                out[t, c] += s * ys[t, c]


@njit(**JIT)
def decode_moe_layer(x, common, router, experts, shared_gu, shared_down, probs_bias, shared_gate, page_table,
                     page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, kc, vc, kpos, ring, row, pos, cos,
                     sin, chunks, par):
    """One decoder block with this mixture on one token; x f32 [d] is updated in place. common[0] holds the
    layer's (qkv, o_mat, vecs, geo, fns, params) (archrun.kernels.decode.layer; geo's FFN fields unused)."""
    qkv, o_mat, vecs, geo, fns, params = common[0]
    a, h = layer.attention_block(x, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin,
                                 chunks, par)
    g = layer.ffn_input(x, a, h, vecs, fns, params)
    f = np.empty((1, x.shape[0]), _F32)
    moe_rows(g.reshape(1, x.shape[0]), f, router, experts, shared_gu, shared_down, probs_bias, shared_gate,
             page_table, page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, chunks, par)
    layer.join(x, a, f[0], vecs, fns, params)
