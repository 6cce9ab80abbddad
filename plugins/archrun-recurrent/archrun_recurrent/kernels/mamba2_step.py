"""Mamba2's mixer token by token as numba kernels: the fast op's steps (archrun_recurrent.mamba2.FastMamba2.mix)
and its fused decode layer (`mamba2_layer`, the op's `fused_layer`, with a dense FFN or a mixture of experts) run
the same inlined `mamba2_token`, so a token's result has the same bits on either path; so does the layer where
the mixer runs beside the attention (`mamba2_beside_layer`, the op's `fused_beside`: Falcon-H1).

One token, with d_inner = H * P, conv_dim = d_inner + 2 G N (archrun_recurrent.mamba2 states the math):
the conv window takes xBC, silu(conv + bias); dt = softplus(dt + dt_bias); per head h (group h // (H / G)):
S = exp(dt A) S + dt x B^T, y = S C + D x; y *= silu(z); then, with a gated norm, an RMS norm over each
group's d_inner / G channels (sums of squares in float64, in channel order) times its weight.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun.kernels.decode.block import product_group
from archrun_recurrent.kernels.block_tail import block_tail

_F32 = np.float32
_STEP = dict(JIT, inline="always")


@njit(**_STEP)
def _silu(v):  # pragma: no cover - compiled
    return v / (_F32(1.0) + np.exp(-v))


@njit(**_STEP)
def _softplus(v):  # pragma: no cover - compiled
    """log(1 + e^v) in float32 (v itself past 20, as torch's softplus threshold)."""
    if v > _F32(20.0):
        return v
    return np.log1p(np.exp(v))


@njit(**_STEP)
def _conv(zxbcdt, di, conv, conv_w, conv_b, xbc):  # pragma: no cover - compiled
    """xbc [conv_dim] = silu(conv_b + causal depthwise conv over [window ; xBC]); the window conv [K-1, conv_dim]
    shifts in place (xBC enters it)."""
    taps = conv_w.shape[1]
    for c in range(conv.shape[1]):
        u = zxbcdt[di + c]
        acc = conv_b[c]
        for j in range(taps - 1):
            acc += conv[j, c] * conv_w[c, j]
        acc += u * conv_w[c, taps - 1]
        xbc[c] = _silu(acc)
        for j in range(taps - 2):
            conv[j, c] = conv[j + 1, c]
        conv[taps - 2, c] = u


@njit(**_STEP)
def _group_norm(y, norm_w, groups, eps):  # pragma: no cover - compiled
    """y [d_inner] in place: RMS norm over each group's channels (float64 sums in order) times norm_w."""
    w = y.shape[0] // groups
    for g in range(groups):
        ss = 0.0
        for i in range(g * w, (g + 1) * w):
            ss += np.float64(y[i]) * np.float64(y[i])
        r = _F32(1.0 / np.sqrt(ss / w + eps))
        for i in range(g * w, (g + 1) * w):
            y[i] = y[i] * r * norm_w[i]


@njit(**_STEP)
def mamba2_token(zxbcdt, conv, ssm, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, y):  # pragma: no cover
    """One token of the mixer: zxbcdt [d_inner + conv_dim + H] (ssm_in's output) -> y [d_inner], the input of
    ssm_out; conv [K-1, conv_dim] and ssm [H, N, P] updated in place. norm_w empty: no gated norm.

    The state is stored state dimension major ([H, N, P], not the math's [H, P, N]): for each state index s the
    loop over a head's P channels is one vector loop (every channel's update and its sum over s in s order,
    the same arithmetic as a loop per channel; the whole token 75 -> 21 us for 16 heads of 64 x 64, one thread)."""
    heads, dims, width = ssm.shape
    di = heads * width
    conv_dim = conv.shape[1]
    xbc = np.empty(conv_dim, _F32)
    _conv(zxbcdt, di, conv, conv_w, conv_b, xbc)
    per_group = heads // groups
    u = np.empty(width, _F32)
    acc = np.empty(width, _F32)
    for h in range(heads):
        dt = _softplus(zxbcdt[di + conv_dim + h] + dt_bias[h])
        decay = np.exp(dt * a[h])
        g = h // per_group
        b0, c0 = di + g * dims, di + groups * dims + g * dims
        xh = xbc[h * width:(h + 1) * width]
        for p in range(width):
            u[p] = dt * xh[p]
            acc[p] = _F32(0.0)
        for s in range(dims):
            row = ssm[h, s]
            bs, cs = xbc[b0 + s], xbc[c0 + s]
            for p in range(width):
                v = row[p] * decay + u[p] * bs
                row[p] = v
                acc[p] += v * cs
        for p in range(width):
            y[h * width + p] = (acc[p] + xh[p] * dd[h]) * _silu(zxbcdt[h * width + p])
    if norm_w.shape[0]:
        _group_norm(y, norm_w, groups, eps)


@njit(**JIT)
def mamba2_tokens(zxbcdt, conv, ssm, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, y):  # pragma: no cover
    """mamba2_token on each row of zxbcdt [n, ...] in order -> y [n, d_inner] (the op-by-op path)."""
    for t in range(zxbcdt.shape[0]):
        mamba2_token(zxbcdt[t], conv, ssm, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, y[t])


@njit(**_STEP)
def _mix(h, in_proj, out_proj, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, gids, state, chunks,
         par):  # pragma: no cover - compiled
    """The mixer's output [d] of the normed input h [d] on one token; the state arrays and their kept copies
    updated (state as mamba2_layer's)."""
    conv, conv_kept = state[0]
    ssm, ssm_kept = state[1]
    di = ssm.shape[0] * ssm.shape[2]
    zxbcdt = np.empty(di + conv.shape[1] + ssm.shape[0], _F32)
    product_group(par, gids[0], in_proj, h, zxbcdt, chunks)
    y = np.empty(di, _F32)
    mamba2_token(zxbcdt, conv, ssm, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, y)
    conv_kept[:] = conv
    ssm_kept[:] = ssm
    out = np.empty(h.shape[0], _F32)
    product_group(par, gids[1], out_proj, y, out, chunks)
    return out


@njit(**JIT)
def mamba2_layer(x, common, in_proj, out_proj, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, gids, moe,
                 state, chunks, par):  # pragma: no cover - compiled
    """One Mamba2 block on one token; x f32 [d] is updated in place.

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer); in_proj,
    out_proj: product groups of ssm_in and ssm_out; gids: their decode pool groups (-1: none); moe: None (a dense
    FFN or none) or the mixture of experts' moe_rows arguments (block_tail); state: ((conv window, its ring row),
    (ssm state, its ring row)) from archrun_recurrent.state.StateSlot.step_arrays.
    """
    _, _, vecs, _, fns, params = common[0]
    h = layer.mixer_input(x, vecs, fns, params)
    out = _mix(h, in_proj, out_proj, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, gids, state, chunks, par)
    block_tail(x, out, h, common, moe, chunks, par)


@njit(**JIT)
def mamba2_beside_layer(x, dense, in_proj, out_proj, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, gids, kc,
                        vc, kpos, ring, row, pos, cos, sin, state, chunks, par):  # pragma: no cover - compiled
    """One block whose Mamba2 mixer runs beside its attention (Falcon-H1) on one token; x f32 [d] is updated in
    place: o = attention(h) + mixer(h) of the normed input h, then the block's post-norm, dense FFN (or none)
    and residual joins, as the interpreter's block computes them.

    dense[0]: the dense layer kernel's (qkv, o, gate_up, down, vecs, geo, fns, params)
    (archrun.kernels.decode.layer); the mixer's arguments as mamba2_layer's; the attention's cache arguments as
    archrun.kernels.decode.fusion.FusedBlock passes them; state: the mixer's, as mamba2_layer's.
    """
    qkv, o_mat, gate_up, down, vecs, geo, fns, params = dense[0]
    h = layer.mixer_input(x, vecs, fns, params)
    o = layer.attention_output(h, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks,
                               par)
    m = _mix(h, in_proj, out_proj, conv_w, conv_b, dt_bias, a, dd, norm_w, groups, eps, gids, state, chunks, par)
    for i in range(o.shape[0]):
        o[i] = o[i] + m[i]
    layer.mixer_output(x, o, h, gate_up, down, vecs, geo, fns, params, chunks, par)
