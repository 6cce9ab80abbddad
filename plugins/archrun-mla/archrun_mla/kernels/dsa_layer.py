"""A sparse-attention layer's decode step as one kernel call (archrun_mla's fast `mla_dsa` op: `fused_layer`).

DeepSeek Sparse Attention is MLA (kernels.mla_layer: the same absorbed query and key, the same output) whose
query reads only the cached rows the lightning indexer picks. The op-by-op path's operations for one token,
in its order (archrun_mla.dsa, archrun_mla.indexer), so a token has the same bits either way:

    the indexer key    layer_norm(indexer.attn_k h) through the index norm's part, roped by the index rope's
                       part (NEOX on the model's rope angles), cached beside the latent row;
    while pos < top_k  every cached row, as MLA;
    else               the indexer query indexer.attn_q_b r_q (roped per head), its head weights
                       indexer.proj h / sqrt(Hi); the scores w . relu(q_i K^T / sqrt(Di)) through numpy's own
                       BLAS calls with numpy's arguments (the keys scaled and transposed [Di, T], sgemm, then
                       sgemv: kernels.blas); the top_k rows ascending (ties at the k-th place to the earlier
                       rows: indexer.top_keys), gathered, then archrun-blocks' one-token attention over them.

A layer's arguments `dsa` (a typed list of one tuple, see archrun_mla.fused):
  idx_h    product group (indexer.attn_k, indexer.proj, -) on h;  idx_q: (indexer.attn_q_b, -, -) on r_q
  k_norm, k_norm_b  f32 [Di];  ig: int64 I_* fields;  sc: f32 [1 / sqrt(Hi), 1 / sqrt(Di)]
  inorm, inp  the index key norm's part value (fn,) and parameters;  irope, irp: the index rope's
  gemm     (kernels.blas.Sgemm,)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun_blocks.decode_attention import attend_one
from archrun_blocks.moe_kernels import moe_rows
from archrun_mla.kernels.blas import mat_mat, vec_mat
from archrun_mla.kernels.mla_layer import M_HEADS, M_LORA, M_ROPE, attend_all, latent_out, latent_qk, product_group

_F32 = np.float32
I_HEADS, I_WIDTH, I_TOP_K, I_GID_H, I_GID_Q = range(5)


@njit(**JIT)
def top_keys(scores, k):
    """The k best rows of scores f32 [T] (T > k), ascending: int64 [k] (archrun_mla.indexer.top_keys: the k-th
    best score, every row above it, then the earliest rows tied with it). NaN scores are never picked; fewer
    than k others give fewer rows."""
    n = scores.shape[0]
    neg = np.empty(n, _F32)
    m = 0
    for t in range(n):
        if scores[t] == scores[t]:
            neg[m] = -scores[t]
            m += 1
    picked = np.empty(k, np.int64)
    if m < k:
        c = 0
        for t in range(n):
            if scores[t] == scores[t]:
                picked[c] = t
                c += 1
        return picked[:c]
    kth = -np.partition(neg[:m], k - 1)[k - 1]
    room = k
    for t in range(n):
        if scores[t] > kth:
            room -= 1
    c = 0
    for t in range(n):
        s = scores[t]
        if s > kth:
            picked[c] = t
            c += 1
        elif s == kth and room > 0:
            room -= 1
            picked[c] = t
            c += 1
    return picked


@njit(**JIT)
def index_scores(iq, w, ik, count, kscale, gemm, gemv):
    """Scores f32 [count] of the roped indexer query iq [Hi Di] with head weights w [Hi] over the cached
    indexer keys ik [cap, 1, Di] rows 0..count-1, as indexer.index_scores_chunked computes one query's: the
    keys scaled and transposed, one sgemm [Hi, Di] x [Di, T], ReLU, one sgemv w [Hi] x [Hi, T]."""
    n_idx, width = w.shape[0], ik.shape[2]
    keys_t = np.empty((width, count), _F32)
    for t in range(count):
        for d in range(width):
            keys_t[d, t] = ik[t, 0, d] * kscale
    dots = np.empty((n_idx, count), _F32)
    mat_mat(gemm, iq.reshape((n_idx, width)), keys_t, dots)
    for i in range(n_idx):
        for t in range(count):
            if dots[i, t] < 0:
                dots[i, t] = 0.0
    scores = np.empty(count, _F32)
    vec_mat(gemv, w, dots, scores)
    return scores


@njit(**JIT)
def dsa_attention(x, mla, dsa, vecs, geo, fns, params, kc, ic, row, pos, cos, sin, chunks, par):
    """The sparse attention sub-block of x f32 [d]: (its output [d], the normed input h [d]); the token's
    [k_pe | latent] row goes to cache row `row` of kc [cap, 1, r + c], its indexer key to ic [cap, 1, Di]."""
    idx_h, idx_q, k_norm, k_norm_b, ig, sc, inorm, inp, irope, irp, gemm = dsa
    g, s, gemv = mla[7], mla[8], mla[11]
    n_idx, width, top_k = ig[I_HEADS], ig[I_WIDTH], ig[I_TOP_K]
    qf, kf, h, r_q = latent_qk(x, mla, vecs, geo, fns, params, cos, sin, chunks, par)
    y = np.empty(width + n_idx, _F32)
    product_group(par, ig[I_GID_H], idx_h, h, y, chunks)
    ik = np.empty(width, _F32)
    inorm[0](inp, y[:width].copy(), k_norm, k_norm_b, ik)
    irope[0](irp, ik, 1, width, cos, sin)
    kc[row, 0, :] = kf
    ic[row, 0, :] = ik
    count = pos + 1
    if count <= top_k:  # a query at a position below top_k reads every key
        att = attend_all(qf, mla, kc, count)
        return latent_out(att, mla, x.shape[0], chunks, par), h
    w = np.empty(n_idx, _F32)
    for i in range(n_idx):
        w[i] = y[width + i] * sc[0]
    iq = np.empty(n_idx * width, _F32)
    product_group(par, ig[I_GID_Q], idx_q, r_q, iq, chunks)
    irope[0](irp, iq, n_idx, width, cos, sin)
    picked = top_keys(index_scores(iq, w, ic, count, sc[1], gemm, gemv), top_k)
    n_head, rope, lora = g[M_HEADS], g[M_ROPE], g[M_LORA]
    n = picked.shape[0]
    keys = np.empty((n, 1, rope + lora), _F32)
    values = np.empty((n, 1, lora), _F32)
    for j in range(n):
        keys[j, 0, :] = kc[picked[j], 0, :]
        values[j, 0, :] = kc[picked[j], 0, rope:]
    att = np.empty(n_head * lora, _F32)
    attend_one(qf, keys, values, np.arange(n), n, n_head, s[0], s[1], att)
    return latent_out(att, mla, x.shape[0], chunks, par), h


@njit(**JIT)
def decode_dsa_layer(x, common, mla, dsa, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """One sparse-attention block with a dense FFN (or none) on one token; x f32 [d] is updated in place.
    vc: the indexer keys [cap, 1, Di] (the op's slot_arrays)."""
    gate_up, down, vecs, geo, fns, params = common[0]
    a, h = dsa_attention(x, mla[0], dsa[0], vecs, geo, fns, params, kc, vc, row, pos, cos, sin, chunks, par)
    layer.mixer_output(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par)


@njit(**JIT)
def decode_dsa_moe_layer(x, common, mla, dsa, router, experts, shared_gu, shared_down, probs_bias, shared_gate,
                         page_table, page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, kc, vc, kpos,
                         ring, row, pos, cos, sin, chunks, par):
    """One sparse-attention block with a mixture of experts on one token (its arguments archrun-blocks'
    moe_rows', as kernels.mla_layer.decode_mla_moe_layer); x f32 [d] is updated in place."""
    gate_up, down, vecs, geo, fns, params = common[0]
    a, h = dsa_attention(x, mla[0], dsa[0], vecs, geo, fns, params, kc, vc, row, pos, cos, sin, chunks, par)
    if vecs[layer.V_POST_ATTN].shape[0]:
        fns[layer.F_NORM][0](params[layer.P_NORM], a, vecs[layer.V_POST_ATTN], np.empty(0, _F32), a)
    g = layer.ffn_input(x, a, h, vecs, fns, params)
    f = np.empty((1, x.shape[0]), _F32)
    moe_rows(g.reshape(1, x.shape[0]), f, router, experts, shared_gu, shared_down, probs_bias, shared_gate,
             page_table, page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, chunks, par)
    layer.join(x, a, f[0], vecs, fns, params)
