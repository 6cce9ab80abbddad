"""Dequantization of repacked row groups into a float32 tile (the prefill path).

`deq_<type>(words, *scales, g0, g1, tile)` writes the rows of groups [g0, g1) transposed:
tile[i, (grp - g0) * LANES + g] = W[grp * LANES + g, i], tile f32 [n_in, >= (g1 - g0) * LANES],
so `x @ tile` gives those output rows with one BLAS call.
Float16/bfloat16 matrices use the same layout with one 16-bit value per field.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT, LANES, QB

_F32 = np.float32
_INLINE = dict(JIT, inline="always")


# Each block becomes value = A * q + B per lane, with (A, B) per 16-element half (A0/B0 for
# elements 0..15, A1/B1 for 16..31; per-32 types pass the same pair twice). The emitters
# write the 32 tile rows of one block: the lane loop (runtime trip count) is the vectorized
# one, the word and field loops have constant counts and unroll inside it.


@njit(**_INLINE)
def _emit4(w, A0, B0, A1, B1, blk):
    """4-bit fields, 8 words: element 4j + k is bits 4k of word j."""
    for g in range(A0.shape[0]):
        for j in range(8):
            v = np.int32(w[j * LANES + g])
            a, b = (A0[g], B0[g]) if j < 4 else (A1[g], B1[g])
            for k in range(4):
                blk[4 * j + k, g] = a * _F32(np.int32((v >> (4 * k)) & 15)) + b


@njit(**_INLINE)
def _emit5(w, A0, B0, A1, B1, blk):
    """5-bit fields, 11 words: element 3j + k is bits 5k of word j."""
    for g in range(A0.shape[0]):
        for e in range(QB):
            v = np.int32(w[(e // 3) * LANES + g])
            a, b = (A0[g], B0[g]) if e < 16 else (A1[g], B1[g])
            blk[e, g] = a * _F32(np.int32((v >> (5 * (e % 3))) & 31)) + b


@njit(**_INLINE)
def _emit2(w, A0, B0, A1, B1, blk):
    """2-bit fields, 4 words: element 8j + k is bits 2k of word j."""
    for g in range(A0.shape[0]):
        for e in range(QB):
            v = np.int32(w[(e >> 3) * LANES + g])
            a, b = (A0[g], B0[g]) if e < 16 else (A1[g], B1[g])
            blk[e, g] = a * _F32(np.int32((v >> (2 * (e & 7))) & 3)) + b


@njit(**_INLINE)
def _emit8(w, A0, B0, A1, B1, blk):
    """Byte fields: element e is w[e * LANES + lane]."""
    for g in range(A0.shape[0]):
        for e in range(QB):
            a, b = (A0[g], B0[g]) if e < 16 else (A1[g], B1[g])
            blk[e, g] = a * _F32(w[e * LANES + g]) + b


@njit(**JIT)
def _emit(bits, w, A0, B0, A1, B1, blk):
    if bits == 4:
        _emit4(w, A0, B0, A1, B1, blk)
    elif bits == 5:
        _emit5(w, A0, B0, A1, B1, blk)
    elif bits == 2:
        _emit2(w, A0, B0, A1, B1, blk)
    else:
        _emit8(w, A0, B0, A1, B1, blk)


@njit(**JIT)
def _affine(W, D, M, bits, offset, g0, g1, tile):
    """Legacy 32-blocks: value d * (q - offset) + m (M may be empty: no min)."""
    nb = W.shape[1]
    a = np.empty(LANES, np.float32)
    c = np.zeros(LANES, np.float32)
    for grp in range(g0, g1):
        for b in range(nb):
            d = D[grp, b]
            for g in range(LANES):
                a[g] = d[g]
                c[g] = (M[grp, b, g] if M.shape[0] else _F32(0.0)) - d[g] * _F32(offset)
            c0 = (grp - g0) * LANES
            _emit(bits, W[grp, b], a, c, a, c, tile[b * QB:(b + 1) * QB, c0:c0 + LANES])


@njit(**JIT)
def _kquant(W, D, DM, SC, MN, bits, offset, sub, g0, g1, tile):
    """K-quants: value d * sc * (q - offset) - dmin * mn per `sub` elements (DM/MN may be empty)."""
    nb = W.shape[1]
    per = QB // sub  # sub-blocks per 32-block (1 or 2)
    a = np.empty((2, LANES), np.float32)
    c = np.empty((2, LANES), np.float32)
    for grp in range(g0, g1):
        for b in range(nb):
            for h in range(2):
                j = b * per + h * (per - 1)
                for g in range(LANES):
                    a[h, g] = D[grp, b >> 3, g] * _F32(SC[grp, j, g])
                    mins = DM[grp, b >> 3, g] * _F32(MN[grp, j, g]) if DM.shape[0] else _F32(0.0)
                    c[h, g] = -mins - a[h, g] * _F32(offset)
            c0 = (grp - g0) * LANES
            _emit(bits, W[grp, b], a[0], c[0], a[1], c[1], tile[b * QB:(b + 1) * QB, c0:c0 + LANES])


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
    _affine(W, D, _NONE_F, 8, 0, g0, g1, tile)


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
def _half_bits(h):
    """float32 bit pattern of an IEEE half (normal, zero, inf/nan); subnormals are fixed later."""
    u = np.uint32(h)
    em = u & np.uint32(0x7FFF)
    e = u & np.uint32(0x7C00)
    bits = (em << np.uint32(13)) + np.uint32(112 << 23)
    if e == np.uint32(0x7C00):
        bits += np.uint32(112 << 23)  # inf / nan keep an all-ones exponent
    elif e == 0:
        bits += np.uint32(1 << 23)  # subnormal: 2^-14 * (1 + m/1024), minus 2^-14 below
    return bits | ((u & np.uint32(0x8000)) << np.uint32(16))


@njit(**JIT)
def _f16_block(w, bits, vals):
    """One block's 32 * LANES halves -> float32 vals (bits: uint32 scratch viewed by vals)."""
    for i in range(w.shape[0]):
        bits[i] = _half_bits(w[i])
    for i in range(w.shape[0]):
        if w[i] & 0x7C00 == 0:  # subnormal or zero: remove the implicit 2^-14
            v = abs(vals[i]) - _F32(6.103515625e-05)
            vals[i] = -v if w[i] & 0x8000 else v


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
    """F16 / BF16 lanes -> tile."""
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
