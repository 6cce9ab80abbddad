"""Matrix-vector products of float16 / bfloat16 weights with float32 activations.

Weights keep their 16-bit values in the lane layout (layout.repack_float16). Where the CPU converts
float16 itself (F16C: every AVX2 host), a row group's elements are converted in registers and multiplied
into the accumulators of up to simd.HALF_TILE activation rows at once, which stay in registers over
the whole row (simd.half_tile: one fma chain per row and lane, so a row's result is the same bits alone
or in a tile of any shape, for decode steps, verification spans and prompts alike). Elsewhere (no F16C,
no JIT) one block of 32 * LANES values is converted to float32 in an L1 scratch, then dotted with every
token's activation block, lanes contiguous. float32 weights need no kernel: they go to BLAS.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from archrun.kernels._jit import JIT, JIT_PAR, LANES, QB
from archrun.kernels.matmul import simd
from archrun.kernels.matmul.dequant import float16_block
from archrun.kernels.matmul.dots import _store

#: whether 16-bit floats go through the register tiles (else the scratch loops)
REGISTERS = simd.F16C and simd.AVX2
_TILE = simd.HALF_TILE


@njit(**JIT)
def _fd8(v, g, x, o):
    """sum_{e < 8} v[(o + e) * LANES + g] * x[o + e]."""
    k = o * LANES + g
    return (v[k] * x[o] + v[k + LANES] * x[o + 1] + v[k + 2 * LANES] * x[o + 2]
            + v[k + 3 * LANES] * x[o + 3] + v[k + 4 * LANES] * x[o + 4] + v[k + 5 * LANES] * x[o + 5]
            + v[k + 6 * LANES] * x[o + 6] + v[k + 7 * LANES] * x[o + 7])


@njit(**JIT)
def _half_registers(W, is_bf16, x, g0, g1, out):
    """half() through the register tiles: x f32 [n, >= nb * 32] with unit element stride."""
    n = x.shape[0]
    acc = np.empty((_TILE, LANES), np.float32)
    for grp in range(g0, g1):
        r0 = grp * LANES
        m = min(LANES, out.shape[1] - r0)
        t = 0
        while t < n:
            if is_bf16:  # noqa: SIM108 (two intrinsics: no common type for a conditional expression)
                k = simd.half_tile_bf16(W[grp], x, t, n - t, acc)
            else:
                k = simd.half_tile(W[grp], x, t, n - t, acc)
            for r in range(k):
                for g in range(m):
                    out[t + r, r0 + g] = acc[r, g]
            t += k


@njit(**JIT)
def half(W, is_bf16, x, g0, g1, out):
    """out[:, rows of groups g0..g1) = x @ W.T for 16-bit float lanes W [ng, nb, 32 * LANES]."""
    if REGISTERS and x.strides[1] == 4:
        _half_registers(W, is_bf16, x, g0, g1, out)
        return
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
