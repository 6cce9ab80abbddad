"""mHC's per-token kernels (the math and its reference: archrun_deepseek4_ops.mhc)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT

_F32 = np.float32


@njit(**JIT)
def _sigmoid(x):
    return _F32(1.0) / (_F32(1.0) + _F32(math.exp(-x)))


@njit(**JIT)
def _sinkhorn(c, iters, eps):
    """c [N, N] in place: columns normalised, then rows and columns iters - 1 times (sum + eps)."""
    n = c.shape[0]
    for it in range(2 * iters - 1):
        rows = it % 2 == 1  # 0: columns, 1: rows, 2: columns, ...
        for a in range(n):
            s = _F32(0.0)
            for b in range(n):
                s += c[a, b] if rows else c[b, a]
            s += eps
            for b in range(n):
                if rows:
                    c[a, b] = c[a, b] / s
                else:
                    c[b, a] = c[b, a] / s


@njit(**JIT)
def hc_weights(m, base, scale, iters, hc_eps, pre, post, comb):
    """pre, post [n, N] and comb [n, N, N] from the mixes m [n, (2 + N) N] (see mhc.HyperConnection)."""
    n_s = pre.shape[1]
    eps = _F32(hc_eps)
    for t in range(m.shape[0]):
        for j in range(n_s):
            pre[t, j] = _sigmoid(m[t, j] * scale[0] + base[j]) + eps
            post[t, j] = _F32(2.0) * _sigmoid(m[t, n_s + j] * scale[1] + base[n_s + j])
        c = comb[t]
        for a in range(n_s):
            top = _F32(-np.inf)
            for b in range(n_s):
                k = 2 * n_s + a * n_s + b
                c[a, b] = m[t, k] * scale[2] + base[k]
                top = max(top, c[a, b])
            s = _F32(0.0)
            for b in range(n_s):
                c[a, b] = _F32(math.exp(c[a, b] - top))
                s += c[a, b]
            for b in range(n_s):
                c[a, b] = c[a, b] / s + eps
        _sinkhorn(c, iters, eps)


@njit(**JIT)
def hc_collapse(streams, pre, out):
    """out [n, d] = sum_j pre[:, j] streams[:, j]."""
    for t in range(streams.shape[0]):
        for i in range(streams.shape[2]):
            s = _F32(0.0)
            for j in range(streams.shape[1]):
                s += pre[t, j] * streams[t, j, i]
            out[t, i] = s


@njit(**JIT)
def hc_expand(streams, post, comb, y, out):
    """out[:, k] = post[:, k] y + sum_j comb[:, j, k] streams[:, j]."""
    n_s = streams.shape[1]
    for t in range(streams.shape[0]):
        for k in range(n_s):
            for i in range(streams.shape[2]):
                s = post[t, k] * y[t, i]
                for j in range(n_s):
                    s += comb[t, j, k] * streams[t, j, i]
                out[t, k, i] = s
