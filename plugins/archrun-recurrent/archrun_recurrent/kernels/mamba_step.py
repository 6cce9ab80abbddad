"""Mamba's (the first selective scan's) mixer as numba kernels: the fast op's steps (archrun_recurrent.mamba.FastMamba)
and its fused decode layer (`mamba_layer`, the op's `fused_layer`, with a dense FFN or a mixture of experts) run
the same inlined steps, so a token's result has the same bits on either path.

One token, with D = d_inner channels, N state dims, R = dt_rank (archrun_recurrent.mamba states the math): the
conv window takes x, silu(conv + bias) (mamba2_step's convolution); dt | B | C = ssm_x x, each RMS-normed
(sums of squares in float64, in order) when the layer has norms; dt = softplus(ssm_dt dt + bias); per
channel S = exp(dt A) S + dt x B^T, y = (S C + D x) * silu(z).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun.kernels.decode.block import product_group
from archrun_recurrent.kernels.block_tail import block_tail
from archrun_recurrent.kernels.mamba2_step import _conv, _silu, _softplus

_F32 = np.float32
_STEP = dict(JIT, inline="always")


@njit(**_STEP)
def _rms(v, w, eps):  # pragma: no cover - compiled
    """v [k] in place: v / sqrt(mean(v^2) + eps) * w (the sum of squares in float64, in order)."""
    ss = 0.0
    for i in range(v.shape[0]):
        ss += np.float64(v[i]) * np.float64(v[i])
    r = _F32(1.0 / np.sqrt(ss / v.shape[0] + eps))
    for i in range(v.shape[0]):
        v[i] = v[i] * r * w[i]


@njit(**_STEP)
def _dbc_norms(dbc, rank, w_dt, w_b, w_c, eps):  # pragma: no cover - compiled
    """dt | B | C of one token (dbc [R + 2N]) through their RMS norms in place (w_dt empty: no norms)."""
    if w_dt.shape[0]:
        dims = w_b.shape[0]
        _rms(dbc[:rank], w_dt, eps)
        _rms(dbc[rank:rank + dims], w_b, eps)
        _rms(dbc[rank + dims:rank + 2 * dims], w_c, eps)


@njit(**_STEP)
def _scan_token(ssm, x, dt, dbc, rank, a, dd, z, y):  # pragma: no cover - compiled
    """y [D] = (S C + D x) * silu(z) for one token, S [D, N] updated in place; dt [D] after softplus, B and C
    from dbc [R + 2N]."""
    width, dims = ssm.shape
    for i in range(width):
        u = dt[i] * x[i]
        acc = _F32(0.0)
        for s in range(dims):
            v = ssm[i, s] * np.exp(dt[i] * a[i, s]) + u * dbc[rank + s]
            ssm[i, s] = v
            acc += v * dbc[rank + dims + s]
        y[i] = (acc + x[i] * dd[i]) * _silu(z[i])


@njit(**JIT)
def conv_tokens(xin, window, conv_w, conv_b, x):  # pragma: no cover - compiled
    """x [n, D] = silu(conv_b + the causal depthwise conv) of xin [n, D] token by token, the window [K-1, D]
    (a copy of the state: the op path keeps the ring's windows itself) shifting in place."""
    for t in range(x.shape[0]):
        _conv(xin[t], 0, window, conv_w, conv_b, x[t])


@njit(**JIT)
def dbc_norms(dbc, rank, w_dt, w_b, w_c, eps):  # pragma: no cover - compiled
    """_dbc_norms on each row of dbc [n, R + 2N] (the op path)."""
    for t in range(dbc.shape[0]):
        _dbc_norms(dbc[t], rank, w_dt, w_b, w_c, eps)


@njit(**JIT)
def softplus_rows(v):  # pragma: no cover - compiled
    """v [n, D] <- softplus(v) (the op path)."""
    for t in range(v.shape[0]):
        for i in range(v.shape[1]):
            v[t, i] = _softplus(v[t, i])


@njit(**JIT)
def scan_tokens(ssm, x, dt, dbc, rank, a, dd, z, y):  # pragma: no cover - compiled
    """_scan_token on each token in order (the op path): x/dt/z/y [n, D], dbc [n, R + 2N]."""
    for t in range(x.shape[0]):
        _scan_token(ssm, x[t], dt[t], dbc[t], rank, a, dd, z[t], y[t])


@njit(**JIT)
def mamba_layer(x, common, in_proj, x_proj, dt_proj, out_proj, conv_w, conv_b, a, dd, rank, w_dt, w_b, w_c, eps,
                gids, moe, state, chunks, par):  # pragma: no cover - compiled
    """One Mamba block on one token; x f32 [d] is updated in place.

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer); in_proj,
    x_proj, dt_proj (with its bias), out_proj: product groups; rank: dt's width R; w_dt, w_b, w_c: the dt/B/C
    norms' weights (empty: none), eps their epsilon; gids: their decode pool groups (-1: none); moe: None (a
    dense FFN or none) or the mixture of experts' moe_rows arguments (block_tail); state: ((conv window, its
    ring row), (ssm state, its ring row)) from StateSlot.step_arrays.
    """
    _, _, vecs, _, fns, params = common[0]
    h = layer.mixer_input(x, vecs, fns, params)
    conv, conv_kept = state[0]
    ssm, ssm_kept = state[1]
    width, dims = ssm.shape
    xz = np.empty(2 * width, _F32)
    product_group(par, gids[0], in_proj, h, xz, chunks)
    xc = np.empty(width, _F32)
    _conv(xz, 0, conv, conv_w, conv_b, xc)
    dbc = np.empty(rank + 2 * dims, _F32)
    product_group(par, gids[1], x_proj, xc, dbc, chunks)
    _dbc_norms(dbc, rank, w_dt, w_b, w_c, eps)
    dt = np.empty(width, _F32)
    product_group(par, gids[2], dt_proj, dbc[:rank].copy(), dt, chunks)
    for i in range(width):
        dt[i] = _softplus(dt[i])
    y = np.empty(width, _F32)
    _scan_token(ssm, xc, dt, dbc, rank, a, dd, xz[width:], y)
    conv_kept[:] = conv
    ssm_kept[:] = ssm
    out = np.empty(x.shape[0], _F32)
    product_group(par, gids[3], out_proj, y, out, chunks)
    block_tail(x, out, h, common, moe, chunks, par)
