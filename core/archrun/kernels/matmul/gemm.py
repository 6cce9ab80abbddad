"""Prefill products as int8 GEMMs: 8-bit-quantized activations x the repacked quantized blocks.

Many tokens (n > qmatrix.INT_MAX_TOKENS) through the same arithmetic as llama.cpp's int8 paths:
the activation is quantized once per product into 32-element blocks (dots.quantize_act, the
decode path's Q8 blocks), then for each row group (LANES output rows, layout.py):

- the group's blocks are unpacked once into unsigned bytes in quads (U uint32 [nb, 8 * LANES],
  word q * LANES + l = elements 4q..4q+3 of lane l) and its scales into per-block, per-lane
  float32 multipliers (A, and M for types with a min), so the unpacking is paid once for all
  tokens and the group's U (nb KB) stays in L1/L2 while every token tile reads it;
- GEMM_TOKENS tokens at a time, every block's exact int32 sums come from simd's tiles
  (vpdpbusd with AVX-512 VNNI, vpmaddubsw + vpmaddwd with AVX2) and are scaled into float32
  accumulators held in registers across the blocks.

Element values and what a tile computes per block b, token t, lane l (q: the stored unsigned
field, x: the activation's int8 block, dx its scale, S its sum, S_h the sums of its halves):
  ONE    a * (q - c)        acc += float(sum(q x) - c S) * (a dx)          Q4_0, Q5_0, Q8_0 (q = w + 128)
  MIN    a * q + m          acc += float(sum(q x)) * (a dx) + m (dx S)      Q4_1, Q5_1, Q4_K, Q5_K
  HALVES a_h * (q - c) per 16 elements, summed over the two halves          Q6_K, Q3_K
  SIGNED a * w, w signed bytes: sums of |w| x sign(x, w)                      Q8_0 on AVX2
(On AVX2 without VNNI, Q8_0's w + 128 up to 255 would saturate vpmaddubsw, so its groups are
unpacked as |w| and w, SIGNED.) Q2_K (halves with a min) keeps the float32 tiles + BLAS path
(`TYPES` lists what takes this one).

Threads: the row groups are split into `chunks` ranges over numba's threads (prefill runs
while the decode pool's workers sleep, so the cores are free for them).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from archrun.kernels._jit import JIT, JIT_PAR, LANES
from archrun.kernels.matmul import dots, simd
from archrun.kernels.matmul.simd import GEMM_TOKENS, HALVES, MIN, ONE, SIGNED

_F32 = np.float32
_U32 = np.uint32
_INLINE = dict(JIT, inline="always")

# -- the portable tile: the arithmetic of simd's tiles, with loops --------------------------------


@njit(**_INLINE)
def _byte_dot(u, x):
    """sum over the 4 bytes of u (unsigned) times the 4 bytes of x (signed)."""
    s = 0
    for k in range(4):
        xb = (x >> (8 * k)) & 255
        s += ((u >> (8 * k)) & 255) * (xb - 256 if xb >= 128 else xb)
    return s


@njit(**_INLINE)
def _byte_dot_signed(w, x):
    """sum over the 4 bytes of w (signed) times the 4 bytes of x (signed)."""
    s = 0
    for k in range(4):
        wb = (w >> (8 * k)) & 255
        xb = (x >> (8 * k)) & 255
        s += (wb - 256 if wb >= 128 else wb) * (xb - 256 if xb >= 128 else xb)
    return s


@njit(**_INLINE)
def _tile_loops(kind, U, XQ, OFF, DXT, A, M, MS, t0, acc):
    """acc f32 [GEMM_TOKENS, LANES] = the products of tokens t0.. with the group (module docstring)."""
    acc[:] = 0
    for b in range(XQ.shape[0]):
        for t in range(acc.shape[0]):
            row = t0 + t
            dx = DXT[b, row]
            for g in range(LANES):
                s0 = np.int64(OFF[b, row, 0])
                s1 = np.int64(OFF[b, row, 1])
                for q in range(8):
                    xq = np.int64(XQ[b, row, q]) & 0xFFFFFFFF
                    if kind == SIGNED:  # U: |w| quads, then w's
                        d = _byte_dot_signed(np.int64(U[b, (8 + q) * LANES + g]), xq)
                    else:
                        d = _byte_dot(np.int64(U[b, q * LANES + g]), xq)
                    if kind == HALVES and q >= 4:
                        s1 += d
                    else:
                        s0 += d
                f = acc[t, g] + _F32(s0) * (A[b, 0, g] * dx)
                if kind == HALVES:
                    f += _F32(s1) * (A[b, 1, g] * dx)
                elif kind == MIN:
                    f += M[b, g] * MS[b, row]
                acc[t, g] = f


@njit(**_INLINE)
def tile_one_loops(U, XQ, OFF, DXT, A, M, MS, t0, acc):
    _tile_loops(ONE, U, XQ, OFF, DXT, A, M, MS, t0, acc)


@njit(**_INLINE)
def tile_min_loops(U, XQ, OFF, DXT, A, M, MS, t0, acc):
    _tile_loops(MIN, U, XQ, OFF, DXT, A, M, MS, t0, acc)


@njit(**_INLINE)
def tile_halves_loops(U, XQ, OFF, DXT, A, M, MS, t0, acc):
    _tile_loops(HALVES, U, XQ, OFF, DXT, A, M, MS, t0, acc)


@njit(**_INLINE)
def tile_signed_loops(U, XQ, OFF, DXT, A, M, MS, t0, acc):
    _tile_loops(SIGNED, U, XQ, OFF, DXT, A, M, MS, t0, acc)


# the tiles this host runs, chosen once at import on the CPU's features
if simd.VNNI:
    ISA = "avx512vnni"
    _tile_one, _tile_min, _tile_halves = simd.tile_one_vnni, simd.tile_min_vnni, simd.tile_halves_vnni
    _tile_signed = tile_signed_loops  # unused: Q8_0 takes ONE (w + 128) with VNNI
elif simd.AVX2:
    ISA = "avx2"
    _tile_one, _tile_min, _tile_halves = simd.tile_one_avx2, simd.tile_min_avx2, simd.tile_halves_avx2
    _tile_signed = simd.tile_signed_avx2
else:
    ISA = ""
    _tile_one, _tile_min, _tile_halves = tile_one_loops, tile_min_loops, tile_halves_loops
    _tile_signed = tile_signed_loops
# Q8_0's unpacking and tile kind: w + 128 against c = 128 with VNNI, |w| and w elsewhere
Q8_KIND, Q8_C = (ONE, 128) if simd.VNNI else (SIGNED, 0)

# ggml types with a GEMM here (qmatrix sends their prefill products to `KERNELS`); none without SIMD
TYPES = frozenset({2, 3, 6, 7, 8, 11, 12, 13, 14} if ISA else ())

# -- activations --------------------------------------------------------------------------------


@njit(**JIT)
def activations(x, kind, c):
    """x f32 [n, n_in] -> XQ int32 [nb, n_pad, 8] (the int8 blocks, 4 per word), OFF int32
    [nb, n_pad, 2] (-c * block sum, or -c * half sums for HALVES; 0 for MIN), DXT f32
    [nb, n_pad] (block scales), MS f32 [nb, n_pad] (dx * block sum, MIN only). Tokens n..n_pad
    are zero (n_pad: n rounded up to GEMM_TOKENS)."""
    X, DX, QH = dots._quantized(x)
    n, nb = DX.shape
    n_pad = -(-n // GEMM_TOKENS) * GEMM_TOKENS
    XQ = np.zeros((nb, n_pad, 8), np.int32)
    OFF = np.zeros((nb, n_pad, 2), np.int32)
    DXT = np.zeros((nb, n_pad), np.float32)
    MS = np.zeros((nb, n_pad), np.float32)
    for t in range(n):
        for b in range(nb):
            xb = X[t, b]
            for q in range(8):
                v = ((np.int64(xb[4 * q]) & 255) | ((np.int64(xb[4 * q + 1]) & 255) << 8)
                     | ((np.int64(xb[4 * q + 2]) & 255) << 16) | ((np.int64(xb[4 * q + 3]) & 255) << 24))
                XQ[b, t, q] = v - (1 << 32) if v >= (1 << 31) else v
            h0, h1 = np.int64(QH[t, b, 0]), np.int64(QH[t, b, 1])
            if kind == HALVES:
                OFF[b, t, 0] = -c * h0
                OFF[b, t, 1] = -c * h1
            else:
                OFF[b, t, 0] = -c * (h0 + h1)
            DXT[b, t] = DX[t, b]
            MS[b, t] = DX[t, b] * _F32(h0 + h1)
    return XQ, OFF, DXT, MS


# -- unpacking one block of a group into quads (U[b]: uint32 [8 * LANES]) ----------------------


@njit(**_INLINE)
def _quads4(w, u):
    """4-bit fields, 8 words: element 4j + k is bits 4k of word j, so quad j is word j spread to bytes."""
    for j in range(8):
        for g in range(LANES):
            v = _U32(w[j * LANES + g])
            u[j * LANES + g] = ((v & _U32(0xF)) | ((v << _U32(4)) & _U32(0xF00)) | ((v << _U32(8)) & _U32(0xF0000))
                                | ((v << _U32(12)) & _U32(0xF000000)))


@njit(**_INLINE)
def _f5(v, t):
    """Field t (5 bits) of a 5-bit word."""
    return (v >> _U32(5 * t)) & _U32(31)


@njit(**_INLINE)
def _quad(a, b, c, d):
    return a | (b << _U32(8)) | (c << _U32(16)) | (d << _U32(24))


@njit(**_INLINE)
def _quads5(w, u):
    """5-bit fields, 11 words: element e is bits 5 (e % 3) of word e // 3. (One lane per iteration
    with every shift constant, and the trip count from a shape: the lane loop vectorizes.)"""
    for g in range(w.shape[0] // 11):
        v0, v1, v2, v3 = _U32(w[g]), _U32(w[LANES + g]), _U32(w[2 * LANES + g]), _U32(w[3 * LANES + g])
        v4, v5, v6, v7 = _U32(w[4 * LANES + g]), _U32(w[5 * LANES + g]), _U32(w[6 * LANES + g]), _U32(w[7 * LANES + g])
        v8, v9, v10 = _U32(w[8 * LANES + g]), _U32(w[9 * LANES + g]), _U32(w[10 * LANES + g])
        u[g] = _quad(_f5(v0, 0), _f5(v0, 1), _f5(v0, 2), _f5(v1, 0))
        u[LANES + g] = _quad(_f5(v1, 1), _f5(v1, 2), _f5(v2, 0), _f5(v2, 1))
        u[2 * LANES + g] = _quad(_f5(v2, 2), _f5(v3, 0), _f5(v3, 1), _f5(v3, 2))
        u[3 * LANES + g] = _quad(_f5(v4, 0), _f5(v4, 1), _f5(v4, 2), _f5(v5, 0))
        u[4 * LANES + g] = _quad(_f5(v5, 1), _f5(v5, 2), _f5(v6, 0), _f5(v6, 1))
        u[5 * LANES + g] = _quad(_f5(v6, 2), _f5(v7, 0), _f5(v7, 1), _f5(v7, 2))
        u[6 * LANES + g] = _quad(_f5(v8, 0), _f5(v8, 1), _f5(v8, 2), _f5(v9, 0))
        u[7 * LANES + g] = _quad(_f5(v9, 1), _f5(v9, 2), _f5(v10, 0), _f5(v10, 1))


@njit(**_INLINE)
def _quads8(w, u):
    """Byte fields, element-major (element e of lane l at e * LANES + l; Q6_K's 0..63)."""
    for q in range(8):
        for g in range(LANES):
            e = 4 * q * LANES + g
            u[q * LANES + g] = (_U32(w[e]) | (_U32(w[e + LANES]) << _U32(8)) | (_U32(w[e + 2 * LANES]) << _U32(16))
                                | (_U32(w[e + 3 * LANES]) << _U32(24)))


@njit(**_INLINE)
def _quads_q8(w, u):
    """Q8_0's int8 quads (layout.py: already quad-major) + 128 -> unsigned bytes."""
    for i in range(8 * LANES):
        u[i] = ((_U32(np.uint8(w[4 * i])) | (_U32(np.uint8(w[4 * i + 1])) << _U32(8))
                 | (_U32(np.uint8(w[4 * i + 2])) << _U32(16)) | (_U32(np.uint8(w[4 * i + 3])) << _U32(24)))
                ^ _U32(0x80808080))


@njit(**_INLINE)
def _quads_q8_signed(w, u):
    """Q8_0's int8 quads as |w| (unsigned bytes, at most 128), then w itself (SIGNED's U)."""
    for i in range(8 * LANES):
        a = _U32(0)
        v = _U32(0)
        for k in range(4):
            wb = np.int64(w[4 * i + k])
            a |= _U32(wb if wb >= 0 else -wb) << _U32(8 * k)
            v |= _U32(np.uint8(w[4 * i + k])) << _U32(8 * k)
        u[i] = a
        u[8 * LANES + i] = v


@njit(**_INLINE)
def _quads(bits, w, u):
    if bits == 4:
        _quads4(w, u)
    elif bits == 5:
        _quads5(w, u)
    elif bits == 8:
        _quads8(w, u)
    elif bits == Q8_SIGNED_QUADS:
        _quads_q8_signed(w, u)
    else:
        _quads_q8(w, u)


# -- a group's blocks and scales -----------------------------------------------------------------

Q8_QUADS = 9  # _quads' field kind of Q8_0 (w + 128)
Q8_SIGNED_QUADS = 10  # Q8_0 as |w| and w (SIGNED)


@njit(**_INLINE)
def _legacy_group(W, D, Mn, bits, grp, U, A, M):
    """32-element blocks: a = d, m = the block's min (Mn empty: none)."""
    for b in range(W.shape[1]):
        _quads(bits, W[grp, b], U[b])
        A[b, 0] = D[grp, b]
        if Mn.shape[0]:
            M[b] = Mn[grp, b]


@njit(**_INLINE)
def _kquant_group(W, D, DM, SC, MN, bits, per, grp, U, A, M):
    """K-quants: a = d * sc per `per` sub-blocks of a 32-block; m = -dmin * mn (DM empty: none)."""
    for b in range(W.shape[1]):
        _quads(bits, W[grp, b], U[b])
        d = D[grp, b >> 3]
        for h in range(per):
            sc = SC[grp, b * per + h]
            for g in range(LANES):
                A[b, h, g] = d[g] * _F32(sc[g])
        if DM.shape[0]:
            dm = DM[grp, b >> 3]
            mn = MN[grp, b]
            for g in range(LANES):
                M[b, g] = -dm[g] * _F32(mn[g])


# -- the product -----------------------------------------------------------------------------------


@njit(**_INLINE)
def _tiles(kind, U, XQ, OFF, DXT, A, M, MS, grp, acc, out):
    """out[:, rows of group grp] for every token tile."""
    n, n_out = out.shape
    r0 = grp * LANES
    m = min(LANES, n_out - r0)
    for t0 in range(0, XQ.shape[1], GEMM_TOKENS):
        if kind == ONE:
            _tile_one(U, XQ, OFF, DXT, A, M, MS, t0, acc)
        elif kind == SIGNED:
            _tile_signed(U, XQ, OFF, DXT, A, M, MS, t0, acc)
        elif kind == MIN:
            _tile_min(U, XQ, OFF, DXT, A, M, MS, t0, acc)
        else:
            _tile_halves(U, XQ, OFF, DXT, A, M, MS, t0, acc)
        for t in range(min(GEMM_TOKENS, n - t0)):
            for g in range(m):
                out[t0 + t, r0 + g] = acc[t, g]


_NONE_F2 = np.zeros((0, 0, 0), np.float32)
_NONE_U2 = np.zeros((0, 0, 0), np.uint8)


@njit(**JIT_PAR)
def _legacy(W, D, Mn, bits, kind, c, x, out, chunks):
    XQ, OFF, DXT, MS = activations(x, kind, c)
    ng, nb = W.shape[0], W.shape[1]
    words = 16 if kind == SIGNED else 8
    for ch in prange(chunks):
        U = np.empty((nb, words * LANES), np.uint32)
        A = np.zeros((nb, 2, LANES), np.float32)
        M = np.zeros((nb, LANES), np.float32)
        acc = np.empty((GEMM_TOKENS, LANES), np.float32)
        for grp in range(ch * ng // chunks, (ch + 1) * ng // chunks):
            _legacy_group(W, D, Mn, bits, grp, U, A, M)
            _tiles(kind, U, XQ, OFF, DXT, A, M, MS, grp, acc, out)


@njit(**JIT_PAR)
def _kquant(W, D, DM, SC, MN, bits, kind, c, x, out, chunks):
    XQ, OFF, DXT, MS = activations(x, kind, c)
    ng, nb = W.shape[0], W.shape[1]
    per = 2 if kind == HALVES else 1
    for ch in prange(chunks):
        U = np.empty((nb, 8 * LANES), np.uint32)
        A = np.zeros((nb, 2, LANES), np.float32)
        M = np.zeros((nb, LANES), np.float32)
        acc = np.empty((GEMM_TOKENS, LANES), np.float32)
        for grp in range(ch * ng // chunks, (ch + 1) * ng // chunks):
            _kquant_group(W, D, DM, SC, MN, bits, per, grp, U, A, M)
            _tiles(kind, U, XQ, OFF, DXT, A, M, MS, grp, acc, out)


# entries: (words, *scales, x f32 [n, n_in], out f32 [n, n_out], chunks), as dots.KERNELS


@njit(**JIT)
def q4_0_gemm(W, D, x, out, chunks):
    _legacy(W, D, _NONE_F2, 4, ONE, 8, x, out, chunks)


@njit(**JIT)
def q4_1_gemm(W, D, Mn, x, out, chunks):
    _legacy(W, D, Mn, 4, MIN, 0, x, out, chunks)


@njit(**JIT)
def q5_0_gemm(W, D, x, out, chunks):
    _legacy(W, D, _NONE_F2, 5, ONE, 16, x, out, chunks)


@njit(**JIT)
def q5_1_gemm(W, D, Mn, x, out, chunks):
    _legacy(W, D, Mn, 5, MIN, 0, x, out, chunks)


@njit(**JIT)
def q8_0_gemm(W, D, x, out, chunks):
    _legacy(W, D, _NONE_F2, Q8_QUADS if Q8_KIND == ONE else Q8_SIGNED_QUADS, Q8_KIND, Q8_C, x, out, chunks)


@njit(**JIT)
def q3_k_gemm(W, D, SC, x, out, chunks):
    _kquant(W, D, _NONE_F2, SC, _NONE_U2, 4, HALVES, 4, x, out, chunks)


@njit(**JIT)
def q4_k_gemm(W, D, DM, SC, MN, x, out, chunks):
    _kquant(W, D, DM, SC, MN, 4, MIN, 0, x, out, chunks)


@njit(**JIT)
def q5_k_gemm(W, D, DM, SC, MN, x, out, chunks):
    _kquant(W, D, DM, SC, MN, 5, MIN, 0, x, out, chunks)


@njit(**JIT)
def q6_k_gemm(W, D, SC, x, out, chunks):
    _kquant(W, D, _NONE_F2, SC, _NONE_U2, 8, HALVES, 32, x, out, chunks)


_ALL = {2: q4_0_gemm, 3: q4_1_gemm, 6: q5_0_gemm, 7: q5_1_gemm, 8: q8_0_gemm, 11: q3_k_gemm,
        12: q4_k_gemm, 13: q5_k_gemm, 14: q6_k_gemm}
# ggml type -> entry, for this host's TYPES
KERNELS = {t: k for t, k in _ALL.items() if t in TYPES}

__all__ = ["ISA", "KERNELS", "TYPES", "activations", "tile_halves_loops", "tile_min_loops", "tile_one_loops",
           "tile_signed_loops"]
