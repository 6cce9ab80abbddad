"""Dequantization of repacked row groups into a float32 tile (the prefill path).

`deq_<type>(words, *scales, g0, g1, tile)` writes the rows of groups [g0, g1) transposed:
tile[i, (grp - g0) * LANES + g] = W[grp * LANES + g, i], tile f32 [n_in, >= (g1 - g0) * LANES],
so `x @ tile` gives those output rows with one BLAS call.
Float16/bfloat16 matrices use the same layout with one 16-bit value per field.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from archrun.kernels._jit import JIT, JIT_PAR, LANES, QB
from archrun.kernels.matmul import simd

_F32 = np.float32
_INLINE = dict(JIT, inline="always")


# Each block becomes value = A * q + B per lane, with (A, B) per 16-element half (A0/B0 for
# elements 0..15, A1/B1 for 16..31; per-32 types pass the same pair twice). The emitters
# write the 32 tile rows of one block, one contiguous row slice per field, lanes innermost
# (a runtime trip count keeps that loop vectorized; fields are truncated to int32 before
# conversion so it stays 32-bit SIMD).


@njit(**_INLINE)
def _row(row, a, b, w, j, sh, mask):
    """row[g] = a[g] * ((w[j * LANES + g] >> sh) & mask) + b[g]."""
    for g in range(a.shape[0]):
        row[g] = a[g] * _F32(np.int32((np.int32(w[j * LANES + g]) >> sh) & mask)) + b[g]


@njit(**_INLINE)
def _emit4(w, A0, B0, A1, B1, tile, r0, c0):
    """4-bit fields, 8 words: element 4j + k is bits 4k of word j."""
    for j in range(8):
        a, b = (A0, B0) if j < 4 else (A1, B1)
        for k in range(4):
            _row(tile[r0 + 4 * j + k, c0:c0 + LANES], a, b, w, j, 4 * k, 15)


@njit(**_INLINE)
def _emit5(w, A0, B0, A1, B1, tile, r0, c0):
    """5-bit fields, 11 words: element 3j + k is bits 5k of word j."""
    for e in range(QB):
        a, b = (A0, B0) if e < 16 else (A1, B1)
        _row(tile[r0 + e, c0:c0 + LANES], a, b, w, e // 3, 5 * (e % 3), 31)


@njit(**_INLINE)
def _emit2(w, A0, B0, A1, B1, tile, r0, c0):
    """2-bit fields, 4 words: element 8j + k is bits 2k of word j."""
    for e in range(QB):
        a, b = (A0, B0) if e < 16 else (A1, B1)
        _row(tile[r0 + e, c0:c0 + LANES], a, b, w, e >> 3, 2 * (e & 7), 3)


@njit(**_INLINE)
def _emit8(w, A0, B0, A1, B1, tile, r0, c0):
    """Byte fields: element e is w[e * LANES + lane]."""
    for e in range(QB):
        a, b = (A0, B0) if e < 16 else (A1, B1)
        row = tile[r0 + e, c0:c0 + LANES]
        for g in range(a.shape[0]):
            row[g] = a[g] * _F32(w[e * LANES + g]) + b[g]


@njit(**_INLINE)
def _emit8_quads(w, A0, B0, tile, r0, c0):
    """Q8_0's byte fields in quads: element e of lane l is w[(e // 4) * 4 * LANES + 4 * l + e % 4]."""
    for e in range(QB):
        row = tile[r0 + e, c0:c0 + LANES]
        base = (e >> 2) * 4 * LANES + (e & 3)
        for g in range(A0.shape[0]):
            row[g] = A0[g] * _F32(w[base + 4 * g]) + B0[g]


# _emit's field kind of Q8_0 (bytes in quads)
QUADS = 9


@njit(**JIT)
def _emit(bits, w, A0, B0, A1, B1, tile, r0, c0):
    if bits == 4:
        _emit4(w, A0, B0, A1, B1, tile, r0, c0)
    elif bits == 5:
        _emit5(w, A0, B0, A1, B1, tile, r0, c0)
    elif bits == 2:
        _emit2(w, A0, B0, A1, B1, tile, r0, c0)
    elif bits == QUADS:
        _emit8_quads(w, A0, B0, tile, r0, c0)
    else:
        _emit8(w, A0, B0, A1, B1, tile, r0, c0)


@njit(**JIT_PAR)
def _affine(W, D, M, bits, offset, g0, g1, tile):
    """Legacy 32-blocks: value d * (q - offset) + m (M may be empty: no min)."""
    nb = W.shape[1]
    off = _F32(offset)
    for grp in prange(g0, g1):
        c = np.empty(LANES, np.float32)
        for b in range(nb):
            d = D[grp, b]
            if M.shape[0]:
                m = M[grp, b]
                for g in range(c.shape[0]):
                    c[g] = m[g] - d[g] * off
            else:
                for g in range(c.shape[0]):
                    c[g] = -d[g] * off
            _emit(bits, W[grp, b], d, c, d, c, tile, b * QB, (grp - g0) * LANES)


@njit(**JIT)
def _kscales(d, sc, dm, mn, off, a, c):
    """a = d * sc, c = -dmin * mn - a * off over lanes (dm/mn empty: no min)."""
    for g in range(a.shape[0]):
        a[g] = d[g] * _F32(sc[g])
        c[g] = -a[g] * off
    if dm.shape[0]:
        for g in range(a.shape[0]):
            c[g] -= dm[g] * _F32(mn[g])


@njit(**JIT_PAR)
def _kquant(W, D, DM, SC, MN, bits, offset, sub, g0, g1, tile):
    """K-quants: value d * sc * (q - offset) - dmin * mn per `sub` elements (DM/MN may be empty)."""
    nb = W.shape[1]
    per = QB // sub  # sub-blocks per 32-block (1 or 2)
    none_f = np.empty(0, np.float32)
    none_u = np.empty(0, np.uint8)
    off = _F32(offset)
    for grp in prange(g0, g1):
        a = np.empty((2, LANES), np.float32)
        c = np.empty((2, LANES), np.float32)
        for b in range(nb):
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3] if DM.shape[0] else none_f
            for h in range(per):
                j = b * per + h
                _kscales(d, SC[grp, j], dm, MN[grp, j] if DM.shape[0] else none_u, off, a[h], c[h])
            _emit(bits, W[grp, b], a[0], c[0], a[per - 1], c[per - 1], tile, b * QB, (grp - g0) * LANES)


_NONE_F = np.zeros((0, 0, 0), np.float32)
_NONE_U = np.zeros((0, 0, 0), np.uint8)


@njit(**JIT)
def deq_q4_0(W, D, g0, g1, tile):
    _affine(W, D, _NONE_F, 4, 8, g0, g1, tile)


@njit(**JIT)
def deq_q4_1(W, D, M, g0, g1, tile):
    _affine(W, D, M, 4, 0, g0, g1, tile)


@njit(**JIT)
def deq_q5_0(W, D, g0, g1, tile):
    _affine(W, D, _NONE_F, 5, 16, g0, g1, tile)


@njit(**JIT)
def deq_q5_1(W, D, M, g0, g1, tile):
    _affine(W, D, M, 5, 0, g0, g1, tile)


@njit(**JIT)
def deq_q8_0(W, D, g0, g1, tile):
    _affine(W, D, _NONE_F, QUADS, 0, g0, g1, tile)


@njit(**JIT)
def deq_q2_k(W, D, DM, SC, MN, g0, g1, tile):
    _kquant(W, D, DM, SC, MN, 2, 0, 16, g0, g1, tile)


@njit(**JIT)
def deq_q3_k(W, D, SC, g0, g1, tile):
    _kquant(W, D, _NONE_F, SC, _NONE_U, 4, 4, 16, g0, g1, tile)


@njit(**JIT)
def deq_q4_k(W, D, DM, SC, MN, g0, g1, tile):
    _kquant(W, D, DM, SC, MN, 4, 0, 32, g0, g1, tile)


@njit(**JIT)
def deq_q5_k(W, D, DM, SC, MN, g0, g1, tile):
    _kquant(W, D, DM, SC, MN, 5, 0, 32, g0, g1, tile)


@njit(**JIT)
def deq_q6_k(W, D, SC, g0, g1, tile):
    _kquant(W, D, _NONE_F, SC, _NONE_U, 8, 32, 16, g0, g1, tile)


# -- 16-bit floats ------------------------------------------------------------------------------


@njit(**JIT)
def _f16_block_f16c(w, bits, vals):
    """One block's IEEE halves -> float32 vals through the CPU's conversion (the same values as the bit moves
    below: both exact). Converting a 1536 x 576 matrix's blocks on one AVX-512 thread: 195 -> 101 us."""
    for i in range(w.shape[0]):
        vals[i] = simd.half_to_float(w[i])


@njit(**JIT)
def _f16_block_bits(w, bits, vals):
    """One block's IEEE halves -> float32 vals (bits: uint32 scratch viewed by vals).

    Shifting exponent and mantissa into float32 position gives the value times 2^-112
    (subnormals included, sign in place); the multiply by 2^112 restores it. Inf and NaN keep
    their all-ones exponent.
    """
    for i in range(w.shape[0]):
        h = np.int32(w[i])
        u = h & 0x7FFF
        inf = ((u + 0x400) >> 15) * 0x7F800000  # exponent all ones: float32 inf/nan exponent
        bits[i] = np.uint32((u << 13) | inf | ((h & 0x8000) << 16))
    for i in range(w.shape[0]):
        vals[i] *= _F32(5.192296858534828e33)  # 2^112


_f16_block = _f16_block_f16c if simd.F16C else _f16_block_bits


@njit(**JIT)
def _bf16_block(w, bits, vals):
    """One block's bfloat16 values -> float32 vals (the top half of the float32 pattern)."""
    for i in range(w.shape[0]):
        bits[i] = np.uint32(w[i]) << np.uint32(16)


@njit(**JIT)
def float16_block(w, is_bf16, bits, vals):
    """Convert one block of 16-bit floats (uint16 words) into vals (float32 view of bits)."""
    if is_bf16:
        _bf16_block(w, bits, vals)
    else:
        _f16_block(w, bits, vals)


@njit(**JIT)
def deq_float16(W, is_bf16, g0, g1, tile):
    """F16 / BF16 lanes -> tile. Serial, as the other types' tiles: BLAS multiplies each tile next, and a
    parallel region between BLAS calls made numba's and BLAS's threads wait for each other's cores
    (measured: 3072 x 576 halves 0.65 ms alone, 7.6-10 ms right after a prefill's BLAS calls)."""
    nb = W.shape[1]
    bits = np.empty(QB * LANES, np.uint32)
    vals = bits.view(np.float32)
    for grp in range(g0, g1):
        for b in range(nb):
            float16_block(W[grp, b], is_bf16, bits, vals)
            c0 = (grp - g0) * LANES
            tile[b * QB:(b + 1) * QB, c0:c0 + LANES] = vals.reshape(QB, LANES)


DEQUANT = {
    2: deq_q4_0, 3: deq_q4_1, 6: deq_q5_0, 7: deq_q5_1, 8: deq_q8_0, 10: deq_q2_k, 11: deq_q3_k,
    12: deq_q4_k, 13: deq_q5_k, 14: deq_q6_k,
}
