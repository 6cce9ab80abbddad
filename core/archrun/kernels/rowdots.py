"""Decode products of several rows: each weight block unpacked once, every row's integer sums from it.

A batch of decode rows (one token of each of several sequences, or a verification span: kernels.layer's
decode_rows) multiplies every weight block with every row's 8-bit activation block. The per-row decode
kernels (dots.py) redo the block's field unpacking inside their integer dot for each row; past a couple
of rows that unpacking is most of a product's work. Here, for each row group and block:

- the block's fields are unpacked once into unsigned bytes in quads (gemm's unpackers: U uint32
  [8 * LANES], word q * LANES + l = elements 4q..4q+3 of lane l);
- every row's exact int32 sums of that block (of the whole block, or of its two 16-element halves) come
  from simd.rows_dot_* (vpdpbusd, U held in registers for all rows), starting at the row's offset
  (-c * its activation sum, as the per-row dots subtract it);
- each row's float32 step is dots.step_<type>, the per-row kernels' own, on the same integers: so every
  row's output is bit-identical to the per-row kernel on that row alone (tests/test_rowdots.py), inside
  any caller (the steps are compiled apart with float flags that allow no contraction or reordering, see
  dots.py: under numba's fastmath the same expressions inlined into two kernels fused differently).

Kernel signature as dots': (words, *scales, X, DX, QH, g0, g1, out) for the row groups [g0, g1) of
out f32 [n, n_out]. `takes(kind, n)` says whether a product of n rows of ggml type `kind` comes here
(kernels.block dispatches on it): only where the host has AVX-512 VNNI (on AVX2 the byte-pair multiply
costs as many instructions per row as the per-row dots), for the types gemm unpacks (Q2_K keeps dots),
from MIN_ROWS[kind] rows on.
Without VNNI (and without the JIT) the loop version of the sums runs: tests compare it with the
intrinsic and the kernels with dots.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels import dots, gemm, simd
from archrun.kernels._jit import JIT, LANES

_INLINE = dict(JIT, inline="always")

# Rows from which a product of each ggml type takes these kernels, where the host has AVX-512 VNNI (one
# thread, SmolLM2 / Qwen2.5 shapes, against the per-row kernels: Q8_0 and Q6_K gain from 2 rows (x1.45,
# x1.10), the 4-bit types from 3 (x1.08-1.17; x0.88-0.95 at 2), the 5-bit ones from 4 (x1.05; x0.64 at 2);
# at 8 rows x1.4-2.3). Without VNNI (or for other types) never.
_NEVER = 1 << 62
_FROM = {2: 3, 3: 3, 6: 4, 7: 4, 8: 2, 11: 3, 12: 3, 13: 4, 14: 2}
MIN_ROWS = np.full(16, _NEVER, np.int64)
if simd.VNNI:
    for _kind, _rows in _FROM.items():
        MIN_ROWS[_kind] = _rows


@njit(**_INLINE)
def takes(kind, n):
    """Whether a product of n rows of ggml type `kind` runs here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K..Q6_K from
    MIN_ROWS[kind] rows on)."""
    return 0 <= kind < MIN_ROWS.shape[0] and n >= MIN_ROWS[kind]


# -- integer sums: the loop version of simd.rows_dot_* ------------------------------------------------


@njit(**_INLINE)
def _rows_dot_loops(halves, U, XQ, OFF, S):
    """S[t, h, l] = OFF[t, h] + sum of byte products of U's quads of part h with XQ[t] (simd.rows_dot_*)."""
    for t in range(XQ.shape[0]):
        for h in range(2 if halves else 1):
            for g in range(LANES):
                S[t, h, g] = OFF[t, h]
        for q in range(8):
            h = q // 4 if halves else 0
            x = np.int64(XQ[t, q]) & 0xFFFFFFFF
            for g in range(LANES):
                S[t, h, g] += gemm._byte_dot(np.int64(U[q * LANES + g]), x)


@njit(**_INLINE)
def rows_dot_one_loops(U, XQ, OFF, S):
    _rows_dot_loops(False, U, XQ, OFF, S)


@njit(**_INLINE)
def rows_dot_halves_loops(U, XQ, OFF, S):
    _rows_dot_loops(True, U, XQ, OFF, S)


if simd.VNNI:
    _dot_one, _dot_halves = simd.rows_dot_one_vnni, simd.rows_dot_halves_vnni
else:
    _dot_one, _dot_halves = rows_dot_one_loops, rows_dot_halves_loops


# -- activations ------------------------------------------------------------------------------------


@njit(**_INLINE)
def row_quads(X, QH, c, halves):
    """X int16 [n, nb, 32] (8-bit values), QH int16 [n, nb, 2] -> XQ int32 [nb, n, 8] (a row's block, 4 bytes
    per word, block-major so one block's rows are contiguous) and OFF int32 [nb, n, 2]: -c * the block's sum
    (OFF[..., 0]; halves: -c * each half's sum)."""
    n, nb = X.shape[0], X.shape[1]
    XQ = np.empty((nb, n, 8), np.int32)
    OFF = np.zeros((nb, n, 2), np.int32)
    for t in range(n):
        for b in range(nb):
            xb = X[t, b]
            for q in range(8):
                v = ((np.int64(xb[4 * q]) & 255) | ((np.int64(xb[4 * q + 1]) & 255) << 8)
                     | ((np.int64(xb[4 * q + 2]) & 255) << 16) | ((np.int64(xb[4 * q + 3]) & 255) << 24))
                XQ[b, t, q] = v - (1 << 32) if v >= (1 << 31) else v
            h0, h1 = np.int64(QH[t, b, 0]), np.int64(QH[t, b, 1])
            if halves:
                OFF[b, t, 0] = -c * h0
                OFF[b, t, 1] = -c * h1
            else:
                OFF[b, t, 0] = -c * (h0 + h1)
    return XQ, OFF


@njit(**_INLINE)
def _block_sums(bits, halves, w, XQb, OFFb, U, S):
    """S [n, 2, LANES] = every row's int32 sums of one block w (unpacked into U first)."""
    gemm._quads(bits, w, U)
    if halves:
        _dot_halves(U, XQb, OFFb, S)
    else:
        _dot_one(U, XQb, OFFb, S)


@njit(**_INLINE)
def _scratch(n):
    """U, S and the accumulators of n rows."""
    return np.empty(8 * LANES, np.uint32), np.empty((n, 2, LANES), np.int32), np.empty((n, LANES), np.float32)


# -- per-type kernels (dots' arithmetic per row; comments: the sums each step receives) ---------------


@njit(**JIT)
def q4_0(W, D, X, DX, QH, g0, g1, out):
    """Q4_0: s = sum(q x) - 8 Sx."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 8, False)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(4, False, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b]
            for t in range(n):
                dots.step_scaled(acc[t], S[t, 0], d, DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q4_1(W, D, M, X, DX, QH, g0, g1, out):
    """Q4_1: s = sum(q x) - 8 Sx."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 8, False)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(4, False, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b]
            m = M[grp, b]
            for t in range(n):
                dots.step_q4_1(acc[t], S[t, 0], d, m, QH[t, b], DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q5_0(W, D, X, DX, QH, g0, g1, out):
    """Q5_0: the halves' sum(q x) - 16 Sx_h."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 16, True)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(5, True, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b]
            for t in range(n):
                dots.step_q5_0(acc[t], S[t, 0], S[t, 1], d, DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q5_1(W, D, M, X, DX, QH, g0, g1, out):
    """Q5_1: the halves' sum(q x) - 16 Sx_h."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 16, True)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(5, True, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b]
            m = M[grp, b]
            for t in range(n):
                dots.step_q5_1(acc[t], S[t, 0], S[t, 1], d, m, QH[t, b], DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q8_0(W, D, X, DX, QH, g0, g1, out):
    """Q8_0: s = sum(q x) with q int8 (unpacked as q + 128, offset 128 Sx)."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 128, False)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(gemm.Q8_QUADS, False, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b]
            for t in range(n):
                dots.step_scaled(acc[t], S[t, 0], d, DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q3_k(W, D, SC, X, DX, QH, g0, g1, out):
    """Q3_K: the halves' sum(q x) - 4 Sx_h (fields 0..7 in 4-bit words)."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 4, True)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(4, True, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                dots.step_q3_k(acc[t], S[t, 0], S[t, 1], d, ca, cb, DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q4_k(W, D, DM, SC, MN, X, DX, QH, g0, g1, out):
    """Q4_K: s = sum(q x) - 8 Sx."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 8, False)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(4, False, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            sc = SC[grp, b]
            mn = MN[grp, b]
            for t in range(n):
                dots.step_q4_k(acc[t], S[t, 0], d, dm, sc, mn, QH[t, b], DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q5_k(W, D, DM, SC, MN, X, DX, QH, g0, g1, out):
    """Q5_K: the halves' sum(q x) - 16 Sx_h."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 16, True)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(5, True, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            sc = SC[grp, b]
            mn = MN[grp, b]
            for t in range(n):
                dots.step_q5_k(acc[t], S[t, 0], S[t, 1], d, dm, sc, mn, QH[t, b], DX[t, b])
        dots._store(out, acc, grp)


@njit(**JIT)
def q6_k(W, D, SC, X, DX, QH, g0, g1, out):
    """Q6_K: the halves' raw sum(q x), q in 0..63 (byte fields, element-major)."""
    n, nb = DX.shape
    XQ, OFF = row_quads(X, QH, 0, True)
    U, S, acc = _scratch(n)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            _block_sums(8, True, W[grp, b], XQ[b], OFF[b], U, S)
            d = D[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                dots.step_q6_k(acc[t], S[t, 0], S[t, 1], d, ca, cb, QH[t, b], DX[t, b])
        dots._store(out, acc, grp)


# ggml type -> kernel (the types `takes` accepts), for tests and tools
KERNELS = {2: q4_0, 3: q4_1, 6: q5_0, 7: q5_1, 8: q8_0, 11: q3_k, 12: q4_k, 13: q5_k, 14: q6_k}
ISA = "avx512vnni" if simd.VNNI else ""

__all__ = ["ISA", "KERNELS", "MIN_ROWS", "row_quads", "rows_dot_halves_loops", "rows_dot_one_loops", "takes"]
