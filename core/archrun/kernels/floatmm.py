"""Matrix-vector products of float16 / bfloat16 weights with float32 activations.

Weights keep their 16-bit values in the lane layout (layout.repack_float16): one block of
32 * LANES values is converted to float32 in an L1 scratch, then dotted with every token's
activation block, lanes contiguous. float32 weights need no kernel: they go to BLAS.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from archrun.kernels._jit import JIT, JIT_PAR, LANES, QB
from archrun.kernels.dequant import float16_block
from archrun.kernels.dots import _store


@njit(**JIT)
def _fd8(v, g, x, o):
    """sum_{e < 8} v[(o + e) * LANES + g] * x[o + e]."""
    k = o * LANES + g
    return (v[k] * x[o] + v[k + LANES] * x[o + 1] + v[k + 2 * LANES] * x[o + 2]
            + v[k + 3 * LANES] * x[o + 3] + v[k + 4 * LANES] * x[o + 4] + v[k + 5 * LANES] * x[o + 5]
            + v[k + 6 * LANES] * x[o + 6] + v[k + 7 * LANES] * x[o + 7])


@njit(**JIT)
def half(W, is_bf16, x, g0, g1, out):
    """out[:, rows of groups g0..g1) = x @ W.T for 16-bit float lanes W [ng, nb, 32 * LANES]."""
    n = x.shape[0]
    nb = W.shape[1]
    bits = np.empty(QB * LANES, np.uint32)
    vals = bits.view(np.float32)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            float16_block(W[grp, b], is_bf16, bits, vals)
            for t in range(n):
                xb = x[t, b * QB:(b + 1) * QB]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += (_fd8(vals, g, xb, 0) + _fd8(vals, g, xb, 8)
                             + _fd8(vals, g, xb, 16) + _fd8(vals, g, xb, 24))
        _store(out, acc, grp)


@njit(**JIT_PAR)
def half_run(W, is_bf16, x, out, chunks):
    """Entry: the row groups split into `chunks` ranges over numba's threads (1: none)."""
    ng = W.shape[0]
    if chunks == 1:
        half(W, is_bf16, x, 0, ng, out)
        return
    for c in prange(chunks):
        half(W, is_bf16, x, c * ng // chunks, (c + 1) * ng // chunks, out)
