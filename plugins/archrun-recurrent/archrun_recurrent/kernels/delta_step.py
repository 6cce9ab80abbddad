"""Gated DeltaNet's and KDA's mixers token by token as numba kernels: the fast ops' steps
(archrun_recurrent.deltanet.FastGatedDeltaNet.mix, archrun_recurrent.kda.FastKda.mix) and their fused decode layers
(`deltanet_layer`, `kda_layer`, with a dense FFN or a mixture of experts: the ops' `fused_layer`) run the same
inlined token steps, so a token's result has the same bits on either path.

One token (archrun_recurrent.deltanet and .kda state the math): the conv window takes the q|k|v projection,
silu(conv) (mamba2_step's convolution, with a zero bias); q and k are l2-normed per key head (sums of squares in
float64, in order), q scaled by 1/sqrt(dk); per value head the state decays (gated DeltaNet: exp(g) for the whole
head; KDA: exp(g_i) per key channel), then S += k (beta (v - S^T k))^T and o = S^T q (every sum in key-channel
order); o is RMS-normed per head (float64 sums, in order) times the norm weight, then gated (silu(z): gated
DeltaNet; sigmoid(gate): KDA).

Float flags: archrun.kernels._jit.JIT (nnan, ninf only), as every mixer kernel: each sum above runs in the order
the code states, so a token's bits depend on its inputs only, whichever kernel inlined the step.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun.kernels.decode.block import product_group
from archrun_recurrent.kernels.block_tail import block_tail
from archrun_recurrent.kernels.mamba2_step import _conv, _silu, _softplus
from archrun_recurrent.kernels.mamba_step import _rms

_F32 = np.float32
_STEP = dict(JIT, inline="always")
L2_EPS = 1e-6  # the q/k l2 norm's epsilon (HF's l2norm default, llama.cpp's ggml_l2_norm eps)


@njit(**_STEP)
def _sigmoid(v):  # pragma: no cover - compiled
    return _F32(1.0) / (_F32(1.0) + np.exp(-v))


@njit(**_STEP)
def _l2norm(v, scale):  # pragma: no cover - compiled
    """v [k] in place: v / sqrt(sum v^2 + 1e-6) * scale (the sum in float64, in order)."""
    ss = 0.0
    for i in range(v.shape[0]):
        ss += np.float64(v[i]) * np.float64(v[i])
    r = _F32(1.0 / np.sqrt(ss + L2_EPS))
    for i in range(v.shape[0]):
        v[i] = v[i] * r * scale


@njit(**_STEP)
def _delta_head(s, q, k, v, decay, beta, kv, o):  # pragma: no cover - compiled
    """One head of the gated delta rule: s [dk, dv] in place; q/k/decay [dk], v/kv/o [dv] (kv scratch)."""
    dk, dv = s.shape
    kv[:] = 0.0
    for i in range(dk):
        for j in range(dv):
            s[i, j] *= decay[i]
            kv[j] += s[i, j] * k[i]
    for j in range(dv):
        kv[j] = (v[j] - kv[j]) * beta          # the delta
        o[j] = 0.0
    for i in range(dk):
        for j in range(dv):
            s[i, j] += k[i] * kv[j]
            o[j] += s[i, j] * q[i]


@njit(**_STEP)
def deltanet_token(qkv, z, ba, conv, state, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled, split, scale, eps,
                   y):  # pragma: no cover - compiled
    """One token of gated DeltaNet: qkv [2 Hk dk + Hv dv] (attn_qkv's output), z [Hv dv] (attn_gate's), ba [2 Hv]
    (ssm_ba's, per key head [b (r) | a (r)]; split: ssm_beta's | ssm_alpha's) -> y [Hv dv], the input of ssm_out;
    conv [K-1, conv_dim] and state [Hv, dk, dv] updated in place. tiled: value head j reads key head j % Hk
    (else j // r)."""
    hv, dk, dv = state.shape
    r = hv // hk
    xbc = np.empty(conv.shape[1], _F32)
    _conv(qkv, 0, conv, conv_w, conv_b, xbc)
    kd = hk * dk
    for g in range(hk):
        _l2norm(xbc[g * dk:(g + 1) * dk], scale)
        _l2norm(xbc[kd + g * dk:kd + (g + 1) * dk], _F32(1.0))
    decay = np.empty(dk, _F32)
    kv = np.empty(dv, _F32)
    for j in range(hv):
        g = j % hk if tiled else j // r
        if split:
            b, al = ba[j], ba[hv + j]
        else:
            b, al = ba[g * 2 * r + j % r], ba[g * 2 * r + r + j % r]
        beta = _sigmoid(b)
        decay[:] = np.exp(_softplus(al + dt_bias[j]) * a[j])
        o = y[j * dv:(j + 1) * dv]
        _delta_head(state[j], xbc[g * dk:(g + 1) * dk], xbc[kd + g * dk:kd + (g + 1) * dk],
                    xbc[2 * kd + j * dv:2 * kd + (j + 1) * dv], decay, beta, kv, o)
        _rms(o, norm_w, eps)
        for i in range(dv):
            o[i] = o[i] * _silu(z[j * dv + i])


@njit(**_STEP)
def kda_token(qkv, f, b, gate, conv, state, conv_w, conv_b, dt_bias, a, norm_w, scale, eps,
              y):  # pragma: no cover - compiled
    """One token of KDA: qkv [3 H dk] (attn_q | attn_k | attn_v's outputs), f [H dk] (ssm_f_b(ssm_f_a h)), b [H]
    (ssm_beta's), gate [H dk] (ssm_g_b(ssm_g_a h) or attn_gate's) -> y [H dk], the input of attn_output; conv
    [K-1, 3 H dk] and state [H, dk, dk] updated in place."""
    heads, dk, dv = state.shape
    inner = heads * dk
    xbc = np.empty(conv.shape[1], _F32)
    _conv(qkv, 0, conv, conv_w, conv_b, xbc)
    for h in range(heads):
        _l2norm(xbc[h * dk:(h + 1) * dk], scale)
        _l2norm(xbc[inner + h * dk:inner + (h + 1) * dk], _F32(1.0))
    decay = np.empty(dk, _F32)
    kv = np.empty(dv, _F32)
    for h in range(heads):
        for i in range(dk):
            c = h * dk + i
            decay[i] = np.exp(_softplus(f[c] + dt_bias[c]) * a[h])
        o = y[h * dv:(h + 1) * dv]
        _delta_head(state[h], xbc[h * dk:(h + 1) * dk], xbc[inner + h * dk:inner + (h + 1) * dk],
                    xbc[2 * inner + h * dv:2 * inner + (h + 1) * dv], decay, _sigmoid(b[h]), kv, o)
        _rms(o, norm_w, eps)
        for i in range(dv):
            o[i] = o[i] * _sigmoid(gate[h * dv + i])


# -- the op path: the token steps on each row in order -------------------------------------------------------


@njit(**JIT)
def deltanet_tokens(qkv, z, ba, conv, state, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled, split, scale, eps,
                    y):  # pragma: no cover - compiled
    """deltanet_token on each row of qkv/z/ba/y [n, ...] in order."""
    for t in range(qkv.shape[0]):
        deltanet_token(qkv[t], z[t], ba[t], conv, state, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled, split,
                       scale, eps, y[t])


@njit(**JIT)
def kda_tokens(qkv, f, b, gate, conv, state, conv_w, conv_b, dt_bias, a, norm_w, scale, eps,
               y):  # pragma: no cover - compiled
    """kda_token on each row of qkv/f/b/gate/y [n, ...] in order."""
    for t in range(qkv.shape[0]):
        kda_token(qkv[t], f[t], b[t], gate[t], conv, state, conv_w, conv_b, dt_bias, a, norm_w, scale, eps, y[t])


# -- the fused decode layers ----------------------------------------------------------------------------------


@njit(**_STEP)
def _deltanet_mix(h, g_in, g_ba, g_out, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled, split, scale, eps, gids,
                  state, chunks, par):  # pragma: no cover - compiled
    """The mixer's output [d] of the normed input h [d]; the state arrays and their ring rows updated."""
    conv, conv_kept = state[0]
    st, st_kept = state[1]
    hv, dk, dv = st.shape
    conv_dim = conv.shape[1]
    qkvz = np.empty(conv_dim + hv * dv, _F32)
    product_group(par, gids[0], g_in, h, qkvz, chunks)
    ba = np.empty(2 * hv, _F32)
    product_group(par, gids[1], g_ba, h, ba, chunks)
    y = np.empty(hv * dv, _F32)
    deltanet_token(qkvz[:conv_dim], qkvz[conv_dim:], ba, conv, st, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled,
                   split, scale, eps, y)
    conv_kept[:] = conv
    st_kept[:] = st
    out = np.empty(h.shape[0], _F32)
    product_group(par, gids[2], g_out, y, out, chunks)
    return out


@njit(**_STEP)
def _kda_mix(h, g_qkv, g_low, g_f, g_g, g_out, conv_w, conv_b, dt_bias, a, norm_w, full_gate, scale, eps, gids,
             state, chunks, par):  # pragma: no cover - compiled
    """The mixer's output [d] of the normed input h [d]; the state arrays and their ring rows updated.
    g_low: f_a | beta | (g_a, or the full-rank gate); g_f: f_b; g_g: g_b (unused with a full-rank gate)."""
    conv, conv_kept = state[0]
    st, st_kept = state[1]
    heads, dk, dv = st.shape
    inner = heads * dk
    qkv = np.empty(3 * inner, _F32)
    product_group(par, gids[0], g_qkv, h, qkv, chunks)
    gw = inner if full_gate else dk
    low = np.empty(dk + heads + gw, _F32)
    product_group(par, gids[1], g_low, h, low, chunks)
    f = np.empty(inner, _F32)
    product_group(par, gids[2], g_f, low[:dk].copy(), f, chunks)
    if full_gate:
        gate = low[dk + heads:].copy()
    else:
        gate = np.empty(inner, _F32)
        product_group(par, gids[3], g_g, low[dk + heads:].copy(), gate, chunks)
    y = np.empty(inner, _F32)
    kda_token(qkv, f, low[dk:dk + heads], gate, conv, st, conv_w, conv_b, dt_bias, a, norm_w, scale, eps, y)
    conv_kept[:] = conv
    st_kept[:] = st
    out = np.empty(h.shape[0], _F32)
    product_group(par, gids[4], g_out, y, out, chunks)
    return out


@njit(**JIT)
def deltanet_layer(x, common, g_in, g_ba, g_out, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled, split, scale, eps,
                   gids, moe, state, chunks, par):  # pragma: no cover - compiled
    """One gated DeltaNet block on one token; x f32 [d] is updated in place.

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer); g_in: the
    product group attn_qkv | attn_gate, g_ba: ssm_ba (or ssm_beta | ssm_alpha), g_out: ssm_out; gids: their
    decode pool groups (-1: none); moe: None (a dense FFN or none) or the mixture of experts' moe_rows arguments
    (block_tail); state: ((conv window, its ring row), (delta state, its ring row)) from
    archrun_recurrent.state.StateSlot.step_arrays.
    """
    _, _, vecs, _, fns, params = common[0]
    h = layer.mixer_input(x, vecs, fns, params)
    out = _deltanet_mix(h, g_in, g_ba, g_out, conv_w, conv_b, dt_bias, a, norm_w, hk, tiled, split, scale, eps, gids,
                        state, chunks, par)
    block_tail(x, out, h, common, moe, chunks, par)


@njit(**JIT)
def kda_layer(x, common, g_qkv, g_low, g_f, g_g, g_out, conv_w, conv_b, dt_bias, a, norm_w, full_gate, scale, eps,
              gids, moe, state, chunks, par):  # pragma: no cover - compiled
    """One KDA block on one token; x f32 [d] is updated in place.

    common[0]: as deltanet_layer's; g_qkv: the product group attn_q | attn_k | attn_v, g_low: ssm_f_a | ssm_beta |
    (ssm_g_a, or attn_gate: full_gate), g_f: ssm_f_b, g_g: ssm_g_b (absent matrices with a full-rank gate), g_out:
    attn_output; gids, moe, state: as deltanet_layer's.
    """
    _, _, vecs, _, fns, params = common[0]
    h = layer.mixer_input(x, vecs, fns, params)
    out = _kda_mix(h, g_qkv, g_low, g_f, g_g, g_out, conv_w, conv_b, dt_bias, a, norm_w, full_gate, scale, eps, gids,
                   state, chunks, par)
    block_tail(x, out, h, common, moe, chunks, par)
