"""A latent-attention layer's decode step as one kernel call (archrun_mla's fast op: `fused_layer`).

The op-by-op path's operations for one token, in its order (archrun_mla.layout, archrun_mla.attention), so a
token's result has the same bits either way: the projections through the decode product groups (the q LoRA's
and the latent's down-projections stacked in one group: each output row is the same product), the q_a / kv_a
norms through the model norm's part, the query heads' absorption of the key up-projection and the output
latents' value up-projection through numpy's own sgemv (kernels.blas: np.matmul's routine), the model's rope
part on [q_pe | q_abs] per head and on [k_pe | latent], then archrun-blocks' one-token attention
(decode_attention.attend_one) over the cached [k_pe | latent] rows, whose last c values are the values. The
block around it (pre-norm, residual joins, dense FFN or mixture of experts) is the core's
(archrun.kernels.decode.layer) and archrun-blocks' (moe_kernels.moe_rows).

A layer's arguments `mla` (a typed list of one tuple, see archrun_mla.fused):
  proj_a   product group: (q_a, kv_a_mqa, -) with a q LoRA, else (attn_q, kv_a_mqa, -)
  q_b      product group (q_b, -, -) (absent without a q LoRA); o_mat: (attn_output, -, -)
  k_b_t    f32 [H, p, c]  (q_nope -> latent);  v_b_t: f32 [H, c, v] (latent -> value)
  q_a_norm, kv_a_norm  f32 [q_lora or 0], [c]
  g        int64 M_* fields;  s: float64 [scale, softcap]
  lnorm, lnp  the q_a / kv_a norm's part value (fn,) and parameters;  gemv: (kernels.blas.Sgemv,)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import block, layer
from archrun_blocks.decode_attention import attend_one
from archrun_blocks.moe_kernels import moe_rows
from archrun_mla.kernels.blas import vec_mat

_F32 = np.float32
_STEP = dict(JIT, inline="always")
M_HEADS, M_NOPE, M_ROPE, M_LORA, M_VD, M_QLORA, M_GID_A, M_GID_QB, M_GID_O = range(9)


@njit(**JIT)
def product_group(par, gid, ms, x, y, chunks):
    """block.product_group, compiled once and called from each of the layer's products (inlined at each
    site it made the layer's compile several minutes long; a call costs nothing beside a product)."""
    block.product_group(par, gid, ms, x, y, chunks)


@njit(**JIT)
def _query(ya, mla, chunks, par):
    """(the query heads [H (p + r)], r_q) from the stacked down-projection ya: with a q LoRA r_q = rms(q_a h)
    [q_lora] and the heads q_b r_q; without one the heads are ya's first H (p + r) values and r_q is empty."""
    proj_a, q_b, o_mat, k_b_t, v_b_t, q_a_norm, kv_a_norm, g, s, lnorm, lnp, gemv = mla
    width = g[M_HEADS] * (g[M_NOPE] + g[M_ROPE])
    if not g[M_QLORA]:
        return ya[:width].copy(), np.empty(0, _F32)
    r_q = np.empty(g[M_QLORA], _F32)
    lnorm[0](lnp, ya[:g[M_QLORA]].copy(), q_a_norm, np.empty(0, _F32), r_q)
    q = np.empty(width, _F32)
    product_group(par, g[M_GID_QB], q_b, r_q, q, chunks)
    return q, r_q


@njit(**JIT)
def latent_qk(x, mla, vecs, geo, fns, params, cos, sin, chunks, par):
    """The absorbed query and key of x f32 [d]'s token, roped: (qf [H (r + c)], kf [r + c], the normed input
    h [d], the normed query LoRA r_q [q_lora], empty without one) (archrun_mla.layout._MlaQkv.project)."""
    proj_a, q_b, o_mat, k_b_t, v_b_t, q_a_norm, kv_a_norm, g, s, lnorm, lnp, gemv = mla
    n_head, nope, rope, lora = g[M_HEADS], g[M_NOPE], g[M_ROPE], g[M_LORA]
    qk, hd = nope + rope, rope + lora
    h = layer.mixer_input(x, vecs, fns, params)
    qa = g[M_QLORA] if g[M_QLORA] else n_head * qk
    ya = np.empty(qa + lora + rope, _F32)
    product_group(par, g[M_GID_A], proj_a, h, ya, chunks)
    q, r_q = _query(ya, mla, chunks, par)
    # [q_pe | k_b_h^T q_nope_h] per head, [k_pe | rms(latent)]
    qf = np.empty(n_head * hd, _F32)
    for i in range(n_head):
        qf[i * hd:i * hd + rope] = q[i * qk + nope:(i + 1) * qk]
        vec_mat(gemv, q[i * qk:i * qk + nope], k_b_t[i], qf[i * hd + rope:(i + 1) * hd])
    kf = np.empty(hd, _F32)
    kf[:rope] = ya[qa + lora:]
    lnorm[0](lnp, ya[qa:qa + lora].copy(), kv_a_norm, np.empty(0, _F32), kf[rope:])
    if geo[layer.G_ROPE]:
        rope_fn, pr = fns[layer.F_ROPE], params[layer.P_ROPE]
        rope_fn[0](pr, qf, n_head, hd, cos, sin)
        rope_fn[0](pr, kf, 1, hd, cos, sin)
    return qf, kf, h, r_q


@njit(**JIT)
def latent_out(att, mla, d, chunks, par):
    """The attention output [d] from the heads' output latents att [H c]: each through its head's v_b, then
    attn_output (archrun_mla.layout._MlaOutput)."""
    proj_a, q_b, o_mat, k_b_t, v_b_t, q_a_norm, kv_a_norm, g, s, lnorm, lnp, gemv = mla
    n_head, lora, vd = g[M_HEADS], g[M_LORA], g[M_VD]
    out = np.empty(n_head * vd, _F32)
    for i in range(n_head):
        vec_mat(gemv, att[i * lora:(i + 1) * lora], v_b_t[i], out[i * vd:(i + 1) * vd])
    a = np.empty(d, _F32)
    product_group(par, g[M_GID_O], o_mat, out, a, chunks)
    return a


@njit(**JIT)
def attend_all(qf, mla, kc, count):
    """Every head's output latent [H c] over the cached [k_pe | latent] rows 0..count-1, the values their
    latents (archrun_mla.attention.MlaAttention)."""
    g, s = mla[7], mla[8]
    n_head, rope, lora = g[M_HEADS], g[M_ROPE], g[M_LORA]
    keys = kc[:count]
    values = np.empty((count, 1, lora), _F32)
    values[:] = keys[:, :, rope:]
    att = np.empty(n_head * lora, _F32)
    attend_one(qf, keys, values, np.arange(count), count, n_head, s[0], s[1], att)
    return att


@njit(**JIT)
def mla_attention(x, mla, vecs, geo, fns, params, kc, row, pos, cos, sin, chunks, par):
    """The latent attention sub-block of x f32 [d]: (its output [d], the normed input h [d]); the token's
    [k_pe | latent] row goes to cache row `row` of kc [cap, 1, r + c]."""
    qf, kf, h, r_q = latent_qk(x, mla, vecs, geo, fns, params, cos, sin, chunks, par)
    kc[row, 0, :] = kf
    att = attend_all(qf, mla, kc, pos + 1)
    return latent_out(att, mla, x.shape[0], chunks, par), h


@njit(**JIT)
def decode_mla_layer(x, common, mla, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """One latent-attention block with a dense FFN (or none) on one token; x f32 [d] is updated in place.
    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer)."""
    gate_up, down, vecs, geo, fns, params = common[0]
    a, h = mla_attention(x, mla[0], vecs, geo, fns, params, kc, row, pos, cos, sin, chunks, par)
    layer.mixer_output(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par)


@njit(**JIT)
def decode_mla_moe_layer(x, common, mla, router, experts, shared_gu, shared_down, probs_bias, shared_gate,
                         page_table, page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, kc, vc, kpos,
                         ring, row, pos, cos, sin, chunks, par):
    """One latent-attention block with a mixture of experts on one token (its arguments archrun-blocks'
    moe_rows', top-level: see moe_kernels.decode_moe_layer); x f32 [d] is updated in place."""
    gate_up, down, vecs, geo, fns, params = common[0]
    a, h = mla_attention(x, mla[0], vecs, geo, fns, params, kc, row, pos, cos, sin, chunks, par)
    if vecs[layer.V_POST_ATTN].shape[0]:
        fns[layer.F_NORM][0](params[layer.P_NORM], a, vecs[layer.V_POST_ATTN], np.empty(0, _F32), a)
    g = layer.ffn_input(x, a, h, vecs, fns, params)
    f = np.empty((1, x.shape[0]), _F32)
    moe_rows(g.reshape(1, x.shape[0]), f, router, experts, shared_gu, shared_down, probs_bias, shared_gate,
             page_table, page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, chunks, par)
    layer.join(x, a, f[0], vecs, fns, params)
