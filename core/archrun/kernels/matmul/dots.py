"""Integer dot products of quantized weights with 8-bit-quantized activations (decode path).

The activation x[n, n_in] is quantized once per matmul into 32-element blocks the way
ggml's quantize_row_q8_0 does it (d = max|x| / 127, q = round-half-away(x / d)), kept as
int16 so products need no widening. A kernel walks row groups (LANES rows, one SIMD lane
each, see layout.py) and 32-element blocks: every lane's integer dot with the activation
block is computed with no horizontal reduction, then scaled into a float32 accumulator per
lane -- the arithmetic of llama.cpp's vec_dot_*_q8_0 / *_q8_K, with per-32 activation
scales for every type.

Where the host has AVX2, block sums come from simd's byte-pair multiplies (exact, the same
integers as the lane loops): Q8_0 (bytes in quads, layout.py) through simd.q8_quads_dot, the
4-bit types (Q4_0, Q4_1, Q4_K) through simd.nibbles_dot, Q3_K's 4-bit fields per 16-element
half through simd.nibbles_halves_dot, the 5-bit ones through simd.fives_dot, Q2_K through
simd.crumbs_dot and Q6_K's bytes through simd.bytes_halves_dot (DOT_PATHS names them).

int16 sums wrap on purpose: a block's sum of q * x (q >= 0) can exceed int16, but the sum of
(q - offset) * x cannot (|q - 8| <= 8 and |x| <= 127 give at most 32 * 8 * 127 = 32512; 5-bit
fields use 16-element halves), and wrapping arithmetic yields it exactly as
`sum(q * x) - offset * sum(x)` mod 2^16. Byte fields (Q8_0, Q6_K) are summed in int32; Q6_K's
half sums then go to float32 (exact: |sum| < 2^24) before the offset and scales, the float
arithmetic of every path.

Kernel signature: (words, *scales, X, DX, QH, g0, g1, out) computes the output rows of
groups [g0, g1) for all n tokens: X int16 [n, nb, 32], DX f32 [n, nb], QH int16 [n, nb, 2]
(sums of each 16-element half of X's blocks), out f32 [n, n_out]. The entry
`<type>_run(words, *scales, x, out, chunks)` quantizes x f32 [n, n_in] and splits the groups
into `chunks` ranges over numba's threads (1: no parallel region).

Code-shape notes (measured; the inner lane loops must compile to 16-bit SIMD):
- lane loops take their trip count from an array shape: a constant count is fully unrolled
  and then loses the int16 narrowing (64-bit lanes, ~4x slower);
- wrap offsets are computed from int16 loads (QH), never from an int64 argument, for the
  same reason;
- lane helpers are inlined (a call per block costs ~40%).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from archrun.kernels import atomics
from archrun.kernels._jit import JIT, JIT_PAR, LANES, QB
from archrun.kernels.matmul import simd
from archrun.kernels.matmul.simd import fma32

_F32 = np.float32
_I16 = np.int16
_INLINE = dict(JIT, inline="always")

# -- activation quantization -----------------------------------------------------------------


@njit(cache=True, nogil=True)  # no fastmath: d and 1/d must round exactly as ggml/gguf-py do
def quantize_act(x, X, DX, QH):
    """x f32 [n, n_in] -> X int16 [n, nb, 32], DX f32 [n, nb], QH int16 [n, nb, 2] (half sums).

    X is bit-identical to the qs of gguf-py's Q8_0 quantization; DX stays float32 (Q8_0
    would round it to f16).
    """
    n, n_in = x.shape
    for t in range(n):
        for b in range(n_in // QB):
            xb = x[t, b * QB:(b + 1) * QB]
            amax = _F32(0.0)
            for e in range(QB):
                amax = max(amax, abs(xb[e]))
            d = amax / _F32(127.0)
            inv = _F32(1.0) / d if d > 0 else _F32(0.0)
            h0 = 0
            h1 = 0
            for e in range(QB):
                v = xb[e] * inv
                a = abs(v)
                f = np.floor(a)
                r = _I16(f + np.floor(_F32(2.0) * (a - f)))  # round half away from zero
                q = -r if v < 0 else r
                X[t, b, e] = q
                if e < QB // 2:
                    h0 += q
                else:
                    h1 += q
            DX[t, b] = d
            QH[t, b, 0] = h0
            QH[t, b, 1] = h1


# -- field sums of one 32-element block, one lane per row -------------------------------------
# Words of a block are flat, w[word * LANES + lane], so every access is a constant offset
# from one base.


@njit(**JIT)
def _nib(w, x, o):
    """Four 4-bit fields of word w times x[o:o+4] (int16 products; callers truncate the sum)."""
    return (_I16(w & 15) * x[o] + _I16((w >> 4) & 15) * x[o + 1]
            + _I16((w >> 8) & 15) * x[o + 2] + _I16(w >> 12) * x[o + 3])


@njit(**JIT)
def _f5(w, x, o):
    """Three 5-bit fields of word w times x[o:o+3] (bit 15 is zero)."""
    return _I16(w & 31) * x[o] + _I16((w >> 5) & 31) * x[o + 1] + _I16(w >> 10) * x[o + 2]


@njit(**JIT)
def _crumb(w, x, o):
    """Eight 2-bit fields of word w times x[o:o+8]."""
    return (_I16(w & 3) * x[o] + _I16((w >> 2) & 3) * x[o + 1] + _I16((w >> 4) & 3) * x[o + 2]
            + _I16((w >> 6) & 3) * x[o + 3] + _I16((w >> 8) & 3) * x[o + 4]
            + _I16((w >> 10) & 3) * x[o + 5] + _I16((w >> 12) & 3) * x[o + 6] + _I16(w >> 14) * x[o + 7])


@njit(**_INLINE)
def _sum4(w, x, c, s):
    """4-bit fields, 8 words: s = sum(q * x) - c, wrapped to int16."""
    for g in range(s.shape[0]):
        s[g] = (_nib(w[g], x, 0) + _nib(w[LANES + g], x, 4) + _nib(w[2 * LANES + g], x, 8)
                + _nib(w[3 * LANES + g], x, 12) + _nib(w[4 * LANES + g], x, 16)
                + _nib(w[5 * LANES + g], x, 20) + _nib(w[6 * LANES + g], x, 24)
                + _nib(w[7 * LANES + g], x, 28) - c)


@njit(**_INLINE)
def _sum4_loops(w, x, xp, c, s):
    """_sum4 with simd.nibbles_dot's signature (xp unused)."""
    _sum4(w, x, c, s)


_nibbles_dot = simd.nibbles_dot if simd.AVX2 else _sum4_loops


@njit(**_INLINE)
def nibble_pairs(X):
    """X int16 [n, nb, 32] -> the int8 pairs simd.nibbles_dot reads, int16 [n, nb, 16]:
    (x[4j], x[4j+2]) at 2j and (x[4j+1], x[4j+3]) at 2j + 1, first element in the low byte."""
    n, nb = X.shape[0], X.shape[1]
    XP = np.empty((n, nb, QB // 2), np.int16)
    for t in range(n):
        for b in range(nb):
            x = X[t, b]
            for j in range(QB // 4):
                XP[t, b, 2 * j] = (x[4 * j] & 0xFF) | (x[4 * j + 2] << 8)
                XP[t, b, 2 * j + 1] = (x[4 * j + 1] & 0xFF) | (x[4 * j + 3] << 8)
    return XP


@njit(**_INLINE)
def _sum4_halves(w, x, c0, c1, sa, sb):
    """4-bit fields per 16-element half: sa, sb = sum(q * x) - c of each half (int16)."""
    for g in range(sa.shape[0]):
        sa[g] = (_nib(w[g], x, 0) + _nib(w[LANES + g], x, 4) + _nib(w[2 * LANES + g], x, 8)
                 + _nib(w[3 * LANES + g], x, 12) - c0)
        sb[g] = (_nib(w[4 * LANES + g], x, 16) + _nib(w[5 * LANES + g], x, 20)
                 + _nib(w[6 * LANES + g], x, 24) + _nib(w[7 * LANES + g], x, 28) - c1)


@njit(**_INLINE)
def _sum5(w, x, c0, c1, sa, sb):
    """5-bit fields, 11 words: sa, sb = sum(q * x) - c of each 16-element half (int16).

    Element 3j + t is field t of word j; elements 0..15 are words 0..4 and field 0 of word 5.
    """
    for g in range(sa.shape[0]):
        w5 = w[5 * LANES + g]
        w10 = w[10 * LANES + g]
        sa[g] = (_f5(w[g], x, 0) + _f5(w[LANES + g], x, 3) + _f5(w[2 * LANES + g], x, 6)
                 + _f5(w[3 * LANES + g], x, 9) + _f5(w[4 * LANES + g], x, 12)
                 + _I16(w5 & 31) * x[15] - c0)
        sb[g] = (_I16((w5 >> 5) & 31) * x[16] + _I16(w5 >> 10) * x[17]
                 + _f5(w[6 * LANES + g], x, 18) + _f5(w[7 * LANES + g], x, 21)
                 + _f5(w[8 * LANES + g], x, 24) + _f5(w[9 * LANES + g], x, 27)
                 + _I16(w10 & 31) * x[30] + _I16((w10 >> 5) & 31) * x[31] - c1)


@njit(**_INLINE)
def _sum5_loops(w, x, xp, c0, c1, sa, sb):
    """_sum5 with simd.fives_dot's signature (xp unused)."""
    _sum5(w, x, c0, c1, sa, sb)


_fives_dot = simd.fives_dot if simd.AVX2 else _sum5_loops

# simd.FIVE_PAIRS as (element of the low byte, element of the high byte or -1: zero)
_FIVE_ELEMS = np.array([(3 * j + int(r[0]), 3 * j + int(r[1]) if len(r) > 1 else -1)
                        for j, r, _ in simd.FIVE_PAIRS], np.int64)


@njit(**_INLINE)
def five_pairs(X):
    """X int16 [n, nb, 32] -> the int8 pairs simd.fives_dot reads, int16 [n, nb, FIVE_PAIR_SLOTS]
    (FIVE_PAIRS order)."""
    n, nb = X.shape[0], X.shape[1]
    XP = np.zeros((n, nb, simd.FIVE_PAIR_SLOTS), np.int16)
    for t in range(n):
        for b in range(nb):
            x = X[t, b]
            for k in range(_FIVE_ELEMS.shape[0]):
                lo, hi = _FIVE_ELEMS[k, 0], _FIVE_ELEMS[k, 1]
                XP[t, b, k] = (x[lo] & 0xFF) | ((x[hi] << 8) if hi >= 0 else 0)
    return XP


@njit(**_INLINE)
def _sum2_halves(w, x, sa, sb):
    """2-bit fields, 4 words: sa, sb = sum(q * x) of each half (at most 16 * 3 * 127)."""
    for g in range(sa.shape[0]):
        sa[g] = _crumb(w[g], x, 0) + _crumb(w[LANES + g], x, 8)
        sb[g] = _crumb(w[2 * LANES + g], x, 16) + _crumb(w[3 * LANES + g], x, 24)


@njit(**_INLINE)
def _sum4_halves_loops(w, x, xp, c0, c1, sa, sb):
    """_sum4_halves with simd.nibbles_halves_dot's signature (xp unused)."""
    _sum4_halves(w, x, c0, c1, sa, sb)


_nibbles_halves_dot = simd.nibbles_halves_dot if simd.AVX2 else _sum4_halves_loops


@njit(**_INLINE)
def _sum2_loops(w, x, xp, sa, sb):
    """_sum2_halves with simd.crumbs_dot's signature (xp unused)."""
    _sum2_halves(w, x, sa, sb)


_crumbs_dot = simd.crumbs_dot if simd.AVX2 else _sum2_loops


@njit(**_INLINE)
def crumb_pairs(X):
    """X int16 [n, nb, 32] -> the int8 pairs simd.crumbs_dot reads, int16 [n, nb, 16]:
    (x[8j+k], x[8j+4+k]) at 4j + k, first element in the low byte."""
    n, nb = X.shape[0], X.shape[1]
    XP = np.empty((n, nb, QB // 2), np.int16)
    for t in range(n):
        for b in range(nb):
            x = X[t, b]
            for j in range(QB // 8):
                for k in range(4):
                    XP[t, b, 4 * j + k] = (x[8 * j + k] & 0xFF) | (x[8 * j + 4 + k] << 8)
    return XP


@njit(**_INLINE)
def _bytes_halves_loops(w, x8, sa, sb):
    """simd.bytes_halves_dot with plain loops: int32 sums of each 16-element half of one block of byte
    fields (element e of lane g at e * LANES + g) times x8 int8 [32]."""
    for g in range(sa.shape[0]):
        a = np.int32(0)
        b = np.int32(0)
        for e in range(QB // 2):
            a += np.int32(w[e * LANES + g]) * np.int32(x8[e])
            b += np.int32(w[(e + QB // 2) * LANES + g]) * np.int32(x8[e + QB // 2])
        sa[g] = a
        sb[g] = b


_bytes_halves_dot = simd.bytes_halves_dot if simd.AVX2 and LANES == 32 else _bytes_halves_loops


# Whether the lane loops ask for the next group's block themselves (_prefetch_block). On AVX-512 VNNI hosts
# (Zen 4) the hardware prefetcher streams their sequential reads alone and the requests only take miss slots:
# 1 thread, 64 distinct 3-5 MB matrices read from memory, without them Q4_0 10-13 -> 16-17 GB/s, Q5_1 10.0 ->
# 13.6, Q2_K 5.2 -> 7.4, Q3_K 8.9 -> 12.3, Q5_K 8.8 -> 11.3 (2 threads +20-35 %); as simd.PREFETCH_NEXT_GROUP
# for the tiles. AVX2-only hosts keep them (not re-measured there). A hint either way: no bit depends on it.
PREFETCH_LOOPS = not simd.VNNI


@njit(**_INLINE)
def _prefetch_block(W, grp, b):
    """Prefetch block b of row group grp of W [groups, nb, words] (C-contiguous) where PREFETCH_LOOPS: the
    loops ask for the next group's block as they reach this one's, so memory streams it while they compute
    (a prefetch never faults: past the last group it asks for nothing useful)."""
    if not PREFETCH_LOOPS:
        return
    words = W.shape[2]
    base = (grp * W.shape[1] + b) * words
    for e in range(0, words, 64 // W.itemsize):
        atomics.prefetch(W, base + e)


@njit(**JIT)
def _store(out, acc, grp):
    """Write the valid rows of group grp: out[:, grp*LANES + g] = acc[:, g]."""
    r0 = grp * LANES
    m = min(LANES, out.shape[1] - r0)
    for t in range(out.shape[0]):
        for g in range(m):
            out[t, r0 + g] = acc[t, g]


# -- per-type kernels -------------------------------------------------------------------------
# Comments give each type's element value; Sx is the integer sum of the activation block.


@njit(**JIT)
def q4_0(W, D, X, DX, QH, g0, g1, out):
    """Q4_0: d * (q - 8). Block dot = d * dx * (sum(q x) - 8 Sx)."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int16)
    XP = nibble_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b]
            for t in range(n):
                _nibbles_dot(w, X[t, b], XP[t, b], (QH[t, b, 0] + QH[t, b, 1]) * 8, s)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += d[g] * (dx * _F32(s[g]))
        _store(out, acc, grp)


@njit(**JIT)
def _q4_1_loops(W, D, M, X, DX, QH, g0, g1, out):
    """Q4_1: d * q + m. Block dot = dx * (d * sum(q x) + m * Sx), accumulated as the VNNI row tiles do:
    acc = fma(m, dx * Sx, fma(d, sum(q x) * dx, acc)), so every host class computes the same bits."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int16)
    XP = nibble_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b]
            m = M[grp, b]
            for t in range(n):
                _nibbles_dot(w, X[t, b], XP[t, b], (QH[t, b, 0] + QH[t, b, 1]) * 8, s)
                sx = _F32(QH[t, b, 0]) + _F32(QH[t, b, 1])
                dx = DX[t, b]
                dsx = dx * sx
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(s[g]) + _F32(8.0) * sx  # sum(q x), exact in float32
                    a[g] = fma32(m[g], dsx, fma32(d[g], isum * dx, a[g]))
        _store(out, acc, grp)


@njit(**JIT)
def _q5_0_loops(W, D, X, DX, QH, g0, g1, out):
    """Q5_0: d * (q - 16)."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    XP = five_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b]
            for t in range(n):
                _fives_dot(w, X[t, b], XP[t, b], QH[t, b, 0] * 16, QH[t, b, 1] * 16, sa, sb)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += d[g] * (dx * (_F32(sa[g]) + _F32(sb[g])))
        _store(out, acc, grp)


@njit(**JIT)
def q5_1(W, D, M, X, DX, QH, g0, g1, out):
    """Q5_1: d * q + m."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    XP = five_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b]
            m = M[grp, b]
            for t in range(n):
                _fives_dot(w, X[t, b], XP[t, b], QH[t, b, 0] * 16, QH[t, b, 1] * 16, sa, sb)
                sx = _F32(QH[t, b, 0]) + _F32(QH[t, b, 1])
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += dx * (d[g] * (_F32(sa[g]) + _F32(sb[g]) + _F32(16.0) * sx) + m[g] * sx)
        _store(out, acc, grp)


@njit(**_INLINE)
def _quads_dot_loops(w, x, out):
    """simd.q8_quads_dot with plain loops (no AVX2, or no JIT): exact int32 lane sums."""
    for g in range(out.shape[0]):
        s = np.int32(0)
        for e in range(QB):
            s += np.int32(w[(e >> 2) * 4 * LANES + 4 * g + (e & 3)]) * np.int32(x[e])
        out[g] = s


_quads_dot = simd.q8_quads_dot if simd.AVX2 else _quads_dot_loops


@njit(**_INLINE)
def _bytes(X):
    """X int16 [n, nb, 32] (values in -127..127) as int8."""
    X8 = np.empty(X.shape, np.int8)
    for t in range(X.shape[0]):
        for b in range(X.shape[1]):
            for e in range(QB):
                X8[t, b, e] = np.int8(X[t, b, e])
    return X8


@njit(**JIT)
def _q8_0_loops(W, D, X, DX, QH, g0, g1, out):
    """Q8_0: d * q, q int8 (quad layout). Block dot = d * dx * isum, isum exact in int32: acc + d * (dx * isum),
    a multiply and an add (the VNNI row tiles fuse them: fma(d, dx * isum, acc). simd.fma32 here measured
    229 -> 287 us for a 4864 x 1024 product on AVX2, so Q8_0's decode bits stay per CPU class)."""
    n, nb = DX.shape
    X8 = _bytes(X)
    isum = np.empty(LANES, np.int32)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b]
            for t in range(n):
                _quads_dot(w, X8[t, b], isum)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += d[g] * (dx * _F32(isum[g]))
        _store(out, acc, grp)


# -- AVX-512 VNNI: each block unpacked once for a tile of up to 4 rows (simd.q4_1_rows_*, q8_0_rows_*) --
# The same kernel serves one row (a decode step) and many (a batch, a verification span): a row takes the
# same IEEE operations in the same order in a tile of any size, so batched rows keep their one-token bits.

ROW_TILE = 4  # rows a tile (simd.*_rows_4)


@njit(**_INLINE)
def _tile_rows(n, t0):
    """Rows of the next tile from row t0 of n: 4, 2 or 1 (the compiled tile sizes)."""
    r = n - t0
    return ROW_TILE if r >= ROW_TILE else (2 if r >= 2 else 1)


@njit(**_INLINE)
def _store_tile(out, acc, grp, t0, rows):
    """out[t0 + r, grp*LANES + g] = acc[r, g] for the tile's rows and the group's valid lanes."""
    r0 = grp * LANES
    m = min(LANES, out.shape[1] - r0)
    for r in range(rows):
        for g in range(m):
            out[t0 + r, r0 + g] = acc[r, g]


@njit(**JIT)
def _q4_1_tiles(W, D, M, X, DX, QH, g0, g1, out):
    """Q4_1 (as _q4_1_loops) in row tiles: acc = fma(m, dx * Sx, fma(d, dx * sum(q x), acc)) per block."""
    n = DX.shape[0]
    acc = np.empty((ROW_TILE, LANES), _F32)
    for grp in range(g0, g1):
        w, d, m = W[grp], D[grp], M[grp]
        t0 = 0
        while t0 < n:
            rows = _tile_rows(n, t0)
            if rows == ROW_TILE:
                simd.q4_1_rows_4(w, d, m, X, DX, QH, t0, acc)
            elif rows == 2:
                simd.q4_1_rows_2(w, d, m, X, DX, QH, t0, acc)
            else:
                simd.q4_1_rows_1(w, d, m, X, DX, QH, t0, acc)
            _store_tile(out, acc, grp, t0, rows)
            t0 += rows


@njit(**JIT)
def _q8_0_tiles(W, D, X, DX, QH, g0, g1, out):
    """Q8_0 (as _q8_0_loops) in row tiles: acc = fma(d, dx * sum(q x), acc) per block."""
    n = DX.shape[0]
    acc = np.empty((ROW_TILE, LANES), _F32)
    for grp in range(g0, g1):
        w, d = W[grp], D[grp]
        t0 = 0
        while t0 < n:
            rows = _tile_rows(n, t0)
            if rows == ROW_TILE:
                simd.q8_0_rows_4(w, d, X, DX, QH, t0, acc)
            elif rows == 2:
                simd.q8_0_rows_2(w, d, X, DX, QH, t0, acc)
            else:
                simd.q8_0_rows_1(w, d, X, DX, QH, t0, acc)
            _store_tile(out, acc, grp, t0, rows)
            t0 += rows




@njit(**JIT)
def q2_k(W, D, DM, SC, MN, X, DX, QH, g0, g1, out):
    """Q2_K: d * sc * q - dmin * mn, per 16 elements."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    XP = crumb_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            ca, cb = SC[grp, 2 * b], SC[grp, 2 * b + 1]
            ma, mb = MN[grp, 2 * b], MN[grp, 2 * b + 1]
            for t in range(n):
                _crumbs_dot(w, X[t, b], XP[t, b], sa, sb)
                xa = _F32(QH[t, b, 0])
                xb = _F32(QH[t, b, 1])
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(ca[g]) * _F32(sa[g]) + _F32(cb[g]) * _F32(sb[g])
                    msum = _F32(ma[g]) * xa + _F32(mb[g]) * xb
                    a[g] += dx * (d[g] * isum - dm[g] * msum)
        _store(out, acc, grp)


@njit(**JIT)
def q3_k(W, D, SC, X, DX, QH, g0, g1, out):
    """Q3_K: d * sc * (q - 4), per 16 elements (fields store q in 0..7)."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    XP = nibble_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                _nibbles_halves_dot(w, X[t, b], XP[t, b], QH[t, b, 0] * 4, QH[t, b, 1] * 4, sa, sb)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(ca[g]) * _F32(sa[g]) + _F32(cb[g]) * _F32(sb[g])
                    a[g] += d[g] * (dx * isum)
        _store(out, acc, grp)


@njit(**JIT)
def _q4_k_loops(W, D, DM, SC, MN, X, DX, QH, g0, g1, out):
    """Q4_K: d * sc * q - dmin * mn, per 32 elements."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int16)
    XP = nibble_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            sc = SC[grp, b]
            mn = MN[grp, b]
            for t in range(n):
                _nibbles_dot(w, X[t, b], XP[t, b], (QH[t, b, 0] + QH[t, b, 1]) * 8, s)
                sx = _F32(QH[t, b, 0]) + _F32(QH[t, b, 1])
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(s[g]) + _F32(8.0) * sx
                    a[g] += dx * (d[g] * _F32(sc[g]) * isum - dm[g] * _F32(mn[g]) * sx)
        _store(out, acc, grp)


@njit(**JIT)
def q5_k(W, D, DM, SC, MN, X, DX, QH, g0, g1, out):
    """Q5_K: d * sc * q - dmin * mn, per 32 elements."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    XP = five_pairs(X)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            sc = SC[grp, b]
            mn = MN[grp, b]
            for t in range(n):
                _fives_dot(w, X[t, b], XP[t, b], QH[t, b, 0] * 16, QH[t, b, 1] * 16, sa, sb)
                sx = _F32(QH[t, b, 0]) + _F32(QH[t, b, 1])
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(sa[g]) + _F32(sb[g]) + _F32(16.0) * sx
                    a[g] += dx * (d[g] * _F32(sc[g]) * isum - dm[g] * _F32(mn[g]) * sx)
        _store(out, acc, grp)


@njit(**JIT)
def _q6_k_loops(W, D, SC, X, DX, QH, g0, g1, out):
    """Q6_K: d * sc * (q - 32), per 16 elements, q in 0..63 (bytes, element-major)."""
    n, nb = DX.shape
    X8 = _bytes(X)
    ia = np.empty(LANES, np.int32)
    ib = np.empty(LANES, np.int32)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            w = W[grp, b]
            _prefetch_block(W, grp + 1, b)
            d = D[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                _bytes_halves_dot(w, X8[t, b], ia, ib)
                oa = _F32(32.0) * _F32(QH[t, b, 0])
                ob = _F32(32.0) * _F32(QH[t, b, 1])
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    sa = _F32(ia[g]) - oa  # exact integers in float32 (|sum| < 2^24)
                    sb = _F32(ib[g]) - ob
                    a[g] += d[g] * (dx * (_F32(ca[g]) * sa + _F32(cb[g]) * sb))
        _store(out, acc, grp)


# -- AVX2: a row at a time, its float accumulators in registers over the row's blocks (simd.*_row_avx2) ---
# The same integer sums and float steps as the lane loops above, so the same bits as theirs; a row takes
# the same steps alone, in a batch or in a verification span.


@njit(**JIT)
def _q4_1_avx2_rows(W, D, M, X, DX, QH, g0, g1, out):
    """Q4_1 (as _q4_1_loops) on AVX2 row tiles."""
    XP = nibble_pairs(X)
    acc = np.empty((1, LANES), _F32)
    for grp in range(g0, g1):
        w, d, m = W[grp], D[grp], M[grp]
        for t in range(DX.shape[0]):
            simd.q4_1_row_avx2(w, d, m, XP, DX, QH, t, acc)
            _store_tile(out, acc, grp, t, 1)


@njit(**JIT)
def _q4_k_avx2_rows(W, D, DM, SC, MN, X, DX, QH, g0, g1, out):
    """Q4_K (as _q4_k_loops) on AVX2 row tiles."""
    XP = nibble_pairs(X)
    acc = np.empty((1, LANES), _F32)
    for grp in range(g0, g1):
        w, d, dm, sc, mn = W[grp], D[grp], DM[grp], SC[grp], MN[grp]
        for t in range(DX.shape[0]):
            simd.q4_k_row_avx2(w, d, dm, sc, mn, XP, DX, QH, t, acc)
            _store_tile(out, acc, grp, t, 1)


@njit(**JIT)
def _q5_0_avx2_rows(W, D, X, DX, QH, g0, g1, out):
    """Q5_0 (as _q5_0_loops) on AVX2 row tiles."""
    XP = five_pairs(X)
    acc = np.empty((1, LANES), _F32)
    for grp in range(g0, g1):
        w, d = W[grp], D[grp]
        for t in range(DX.shape[0]):
            simd.q5_0_row_avx2(w, d, XP, DX, QH, t, acc)
            _store_tile(out, acc, grp, t, 1)


@njit(**JIT)
def _q8_0_avx2_rows(W, D, X, DX, QH, g0, g1, out):
    """Q8_0 (as _q8_0_loops) on AVX2 row tiles."""
    X8 = _bytes(X)
    acc = np.empty((1, LANES), _F32)
    for grp in range(g0, g1):
        w, d = W[grp], D[grp]
        for t in range(DX.shape[0]):
            simd.q8_0_row_avx2(w, d, X8, DX, t, acc)
            _store_tile(out, acc, grp, t, 1)


@njit(**JIT)
def _q6_k_avx2_rows(W, D, SC, X, DX, QH, g0, g1, out):
    """Q6_K (as _q6_k_loops) on AVX2 row tiles."""
    X8 = _bytes(X)
    acc = np.empty((1, LANES), _F32)
    for grp in range(g0, g1):
        w, d, sc = W[grp], D[grp], SC[grp]
        for t in range(DX.shape[0]):
            simd.q6_k_row_avx2(w, d, sc, X8, DX, QH, t, acc)
            _store_tile(out, acc, grp, t, 1)


# the decode kernels of these types: tiles where the host has AVX-512 VNNI, row tiles on AVX2 (bytes_halves
# needs LANES = 32), else the lane loops
q4_1 = _q4_1_tiles if simd.VNNI else _q4_1_avx2_rows if simd.AVX2 else _q4_1_loops
q8_0 = _q8_0_tiles if simd.VNNI else _q8_0_avx2_rows if simd.AVX2 else _q8_0_loops
q5_0 = _q5_0_avx2_rows if simd.AVX2 else _q5_0_loops  # (the VNNI hosts' too)
q4_k = _q4_k_avx2_rows if simd.AVX2 else _q4_k_loops  # no VNNI tile: the AVX2 one serves those hosts too
q6_k = _q6_k_avx2_rows if simd.AVX2 and LANES == 32 else _q6_k_loops


# -- entries: quantize x, then split the row groups into `chunks` ranges over the threads ----


@njit(**JIT)
def _quantized(x):
    """Scratch X, DX, QH for x, filled by quantize_act."""
    n, n_in = x.shape
    nb = n_in // QB
    X = np.empty((n, nb, QB), np.int16)
    DX = np.empty((n, nb), np.float32)
    QH = np.empty((n, nb, 2), np.int16)
    quantize_act(x, X, DX, QH)
    return X, DX, QH


@njit(**JIT_PAR)
def q4_0_run(W, D, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q4_0(W, D, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q4_0(W, D, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q4_1_run(W, D, M, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q4_1(W, D, M, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q4_1(W, D, M, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q5_0_run(W, D, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q5_0(W, D, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q5_0(W, D, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q5_1_run(W, D, M, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q5_1(W, D, M, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q5_1(W, D, M, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q8_0_run(W, D, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q8_0(W, D, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q8_0(W, D, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q2_k_run(W, D, DM, SC, MN, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q2_k(W, D, DM, SC, MN, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q2_k(W, D, DM, SC, MN, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q3_k_run(W, D, SC, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q3_k(W, D, SC, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q3_k(W, D, SC, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q4_k_run(W, D, DM, SC, MN, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q4_k(W, D, DM, SC, MN, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q4_k(W, D, DM, SC, MN, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q5_k_run(W, D, DM, SC, MN, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q5_k(W, D, DM, SC, MN, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q5_k(W, D, DM, SC, MN, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**JIT_PAR)
def q6_k_run(W, D, SC, x, out, chunks):
    X, DX, QH = _quantized(x)
    ng = W.shape[0]
    if chunks == 1:  # no parallel region: no thread wake-up
        q6_k(W, D, SC, X, DX, QH, 0, ng, out)
        return
    for c in prange(chunks):
        q6_k(W, D, SC, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


# ggml type -> the block dot its decode kernel runs (what bench_kernels.py --products reports)
_SIMD = simd.AVX2
DOT_PATHS = {
    2: "simd.nibbles_dot" if _SIMD else "loops",
    3: "simd.q4_1_rows" if simd.VNNI else "simd.q4_1_row_avx2" if _SIMD else "loops",
    6: "simd.q5_0_row_avx2" if _SIMD else "loops", 7: "simd.fives_dot" if _SIMD else "loops",
    8: "simd.q8_0_rows" if simd.VNNI else "simd.q8_0_row_avx2" if _SIMD else "loops",
    10: "simd.crumbs_dot" if _SIMD else "loops",
    11: "simd.nibbles_halves_dot" if _SIMD else "loops", 12: "simd.q4_k_row_avx2" if _SIMD else "loops",
    13: "simd.fives_dot" if _SIMD else "loops", 14: "simd.q6_k_row_avx2" if _SIMD and LANES == 32 else "loops",
}

# ggml type -> entry (words, *scales, x, out, chunks)
KERNELS = {
    2: q4_0_run, 3: q4_1_run, 6: q5_0_run, 7: q5_1_run, 8: q8_0_run, 10: q2_k_run, 11: q3_k_run,
    12: q4_k_run, 13: q5_k_run, 14: q6_k_run,
}
