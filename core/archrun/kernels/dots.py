"""Integer dot products of quantized weights with 8-bit-quantized activations (decode path).

The activation x[n, n_in] is quantized once per matmul into 32-element blocks the way
ggml's quantize_row_q8_0 does it (d = max|x| / 127, q = round-half-away(x / d)), kept as
int16 so products need no widening. A kernel then walks row groups (LANES rows, one SIMD
lane each, see layout.py) and 32-element blocks: the block's integer dot for every lane is
computed in int16/int32 with no horizontal reduction, then scaled into a float32
accumulator per lane -- the same arithmetic as llama.cpp's vec_dot_*_q8_0 / *_q8_K, with
per-32 activation scales for every type.

int16 sums wrap on purpose: a block's sum of q * x (q >= 0) can exceed int16, but the sum of
(q - offset) * x cannot (e.g. |q - 8| <= 8 and |x| <= 127 give at most 32 * 8 * 127 = 32512),
and wrapping arithmetic gives that sum exactly as `sum(q * x) - offset * sum(x)` mod 2^16.

Kernel signature: (words, *scales, X, DX, QS, g0, g1, out) computes output rows of groups
[g0, g1) for all n tokens; X int16 [n, nb, 32], DX f32 [n, nb], QS int32 [n, nb, 2] (sums of
each 16-element half of X's blocks), out f32 [n, n_out].
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT, LANES, QB

_F32 = np.float32


# -- activation quantization -----------------------------------------------------------------


@njit(cache=True, nogil=True)  # no fastmath: d and 1/d must round exactly as ggml/gguf-py do
def quantize_act(x, X, DX, QS):
    """x f32 [n, n_in] -> X int16 [n, nb, 32], DX f32 [n, nb], QS int32 [n, nb, 2] (half sums)."""
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
                r = np.int16(f + np.floor(_F32(2.0) * (a - f)))  # round half away from zero
                q = -r if v < 0 else r
                X[t, b, e] = q
                if e < QB // 2:
                    h0 += q
                else:
                    h1 += q
            DX[t, b] = d
            QS[t, b, 0] = h0
            QS[t, b, 1] = h1


# -- lane dot products of one 32-element block ------------------------------------------------


_I16 = np.int16


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


@njit(**JIT)
def _p(w, x):
    """int32 of an int16 product (|byte field * x| <= 128 * 127 fits int16)."""
    return np.int32(_I16(_I16(w) * x))


@njit(**JIT)
def _byte8(w, g, x, o):
    """Eight byte fields (elements o..o+7 of lane g) times x[o:o+8], int32."""
    k = o * LANES + g
    return (_p(w[k], x[o]) + _p(w[k + LANES], x[o + 1]) + _p(w[k + 2 * LANES], x[o + 2])
            + _p(w[k + 3 * LANES], x[o + 3]) + _p(w[k + 4 * LANES], x[o + 4])
            + _p(w[k + 5 * LANES], x[o + 5]) + _p(w[k + 6 * LANES], x[o + 6])
            + _p(w[k + 7 * LANES], x[o + 7]))


# Lane helpers take one block's words flat, w[word * LANES + lane], so every access is a
# constant offset from one base; the lane loop's trip count comes from the output array so
# LLVM vectorizes it (a constant count gets fully unrolled and loses the int16 narrowing).
# Offsets c arrive as int16 for the same reason.


@njit(**JIT)
def _lanes4(w, x, c, s16):
    """4-bit fields, 8 words: s16 = sum(q * x) - c, wrapped to int16."""
    for g in range(s16.shape[0]):
        s16[g] = (_nib(w[g], x, 0) + _nib(w[LANES + g], x, 4) + _nib(w[2 * LANES + g], x, 8)
                  + _nib(w[3 * LANES + g], x, 12) + _nib(w[4 * LANES + g], x, 16)
                  + _nib(w[5 * LANES + g], x, 20) + _nib(w[6 * LANES + g], x, 24)
                  + _nib(w[7 * LANES + g], x, 28) - c)


@njit(**JIT)
def _lanes4_halves(w, x, c0, c1, sa, sb):
    """4-bit fields per 16-element half: sa, sb = sum(q * x) - c of each half (int16)."""
    for g in range(sa.shape[0]):
        sa[g] = (_nib(w[g], x, 0) + _nib(w[LANES + g], x, 4) + _nib(w[2 * LANES + g], x, 8)
                 + _nib(w[3 * LANES + g], x, 12) - c0)
        sb[g] = (_nib(w[4 * LANES + g], x, 16) + _nib(w[5 * LANES + g], x, 20)
                 + _nib(w[6 * LANES + g], x, 24) + _nib(w[7 * LANES + g], x, 28) - c1)


@njit(**JIT)
def _lanes5(w, x, c0, c1, sa, sb):
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


@njit(**JIT)
def _lanes_bytes(w, x, s32):
    """Byte fields, 32 per lane: s32 = sum(q * x)."""
    for g in range(s32.shape[0]):
        s32[g] = _byte8(w, g, x, 0) + _byte8(w, g, x, 8) + _byte8(w, g, x, 16) + _byte8(w, g, x, 24)


@njit(**JIT)
def _lanes_bytes_halves(w, x, sa, sb):
    """Byte fields per 16-element half: sa, sb = sum(q * x) of each half."""
    for g in range(sa.shape[0]):
        sa[g] = _byte8(w, g, x, 0) + _byte8(w, g, x, 8)
        sb[g] = _byte8(w, g, x, 16) + _byte8(w, g, x, 24)


@njit(**JIT)
def _lanes2_halves(w, x, sa, sb):
    """2-bit fields, 4 words: sa, sb = sum(q * x) of each half (at most 16 * 3 * 127)."""
    for g in range(sa.shape[0]):
        sa[g] = _crumb(w[g], x, 0) + _crumb(w[LANES + g], x, 8)
        sb[g] = _crumb(w[2 * LANES + g], x, 16) + _crumb(w[3 * LANES + g], x, 24)


@njit(**JIT)
def _store(out, acc, grp):
    """Write the valid rows of group grp: out[:, grp*LANES + g] = acc[:, g]."""
    r0 = grp * LANES
    m = min(LANES, out.shape[1] - r0)
    for t in range(out.shape[0]):
        for g in range(m):
            out[t, r0 + g] = acc[t, g]


# -- per-type kernels -------------------------------------------------------------------------


@njit(**JIT)
def q4_0(W, D, X, DX, QS, g0, g1, out):
    """Q4_0: value d * (q - 8); sum (q - 8) x fits int16 per block."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b]
            for t in range(n):
                _lanes4(W[grp, b], X[t, b], _I16(8 * (QS[t, b, 0] + QS[t, b, 1])), s)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += d[g] * (dx * _F32(s[g]))
        _store(out, acc, grp)


@njit(**JIT)
def q4_1(W, D, M, X, DX, QS, g0, g1, out):
    """Q4_1: value d * q + m; dot = dx * (d * (s + 8 sum x) + m * sum x)."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b]
            m = M[grp, b]
            for t in range(n):
                qx = QS[t, b, 0] + QS[t, b, 1]
                _lanes4(W[grp, b], X[t, b], _I16(8 * qx), s)
                dx = DX[t, b]
                q8 = _F32(8 * qx)
                qf = _F32(qx)
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += dx * (d[g] * (_F32(s[g]) + q8) + m[g] * qf)
        _store(out, acc, grp)


@njit(**JIT)
def q5_0(W, D, X, DX, QS, g0, g1, out):
    """Q5_0: value d * (q - 16)."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b]
            for t in range(n):
                _lanes5(W[grp, b], X[t, b], _I16(16 * QS[t, b, 0]), _I16(16 * QS[t, b, 1]), sa, sb)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += d[g] * (dx * (_F32(sa[g]) + _F32(sb[g])))
        _store(out, acc, grp)


@njit(**JIT)
def q5_1(W, D, M, X, DX, QS, g0, g1, out):
    """Q5_1: value d * q + m."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b]
            m = M[grp, b]
            for t in range(n):
                qx = QS[t, b, 0] + QS[t, b, 1]
                _lanes5(W[grp, b], X[t, b], _I16(16 * QS[t, b, 0]), _I16(16 * QS[t, b, 1]), sa, sb)
                dx = DX[t, b]
                q16 = _F32(16 * qx)
                qf = _F32(qx)
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += dx * (d[g] * (_F32(sa[g]) + _F32(sb[g]) + q16) + m[g] * qf)
        _store(out, acc, grp)


@njit(**JIT)
def q8_0(W, D, X, DX, QS, g0, g1, out):
    """Q8_0: value d * q, q int8."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int32)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b]
            for t in range(n):
                _lanes_bytes(W[grp, b], X[t, b], s)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += d[g] * (dx * _F32(s[g]))
        _store(out, acc, grp)


@njit(**JIT)
def q2_k(W, D, DM, SC, X, DX, QS, g0, g1, out):
    """Q2_K: value d * (sc & 15) * q - dmin * (sc >> 4) per 16 elements."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                _lanes2_halves(W[grp, b], X[t, b], sa, sb)
                dx = DX[t, b]
                qa = _F32(QS[t, b, 0])
                qb = _F32(QS[t, b, 1])
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(np.int32(ca[g] & 15) * sa[g] + np.int32(cb[g] & 15) * sb[g])
                    msum = _F32(ca[g] >> 4) * qa + _F32(cb[g] >> 4) * qb
                    a[g] += dx * (d[g] * isum - dm[g] * msum)
        _store(out, acc, grp)


@njit(**JIT)
def q3_k(W, D, SC, X, DX, QS, g0, g1, out):
    """Q3_K: value d * sc * (q - 4) per 16 elements (fields store q in 0..7)."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                _lanes4_halves(W[grp, b], X[t, b], _I16(4 * QS[t, b, 0]), _I16(4 * QS[t, b, 1]), sa, sb)
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = np.int32(ca[g]) * sa[g] + np.int32(cb[g]) * sb[g]
                    a[g] += d[g] * (dx * _F32(isum))
        _store(out, acc, grp)


@njit(**JIT)
def q4_k(W, D, DM, SC, MN, X, DX, QS, g0, g1, out):
    """Q4_K: value d * sc * q - dmin * mn per 32 elements."""
    n, nb = DX.shape
    s = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            sc = SC[grp, b]
            mn = MN[grp, b]
            for t in range(n):
                qx = QS[t, b, 0] + QS[t, b, 1]
                _lanes4(W[grp, b], X[t, b], _I16(8 * qx), s)
                dx = DX[t, b]
                q8 = _F32(8 * qx)
                qf = _F32(qx)
                a = acc[t]
                for g in range(a.shape[0]):
                    a[g] += dx * (d[g] * _F32(sc[g]) * (_F32(s[g]) + q8) - dm[g] * _F32(mn[g]) * qf)
        _store(out, acc, grp)


@njit(**JIT)
def q5_k(W, D, DM, SC, MN, X, DX, QS, g0, g1, out):
    """Q5_K: value d * sc * q - dmin * mn per 32 elements."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int16)
    sb = np.empty(LANES, np.int16)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b >> 3]
            dm = DM[grp, b >> 3]
            sc = SC[grp, b]
            mn = MN[grp, b]
            for t in range(n):
                qx = QS[t, b, 0] + QS[t, b, 1]
                _lanes5(W[grp, b], X[t, b], _I16(16 * QS[t, b, 0]), _I16(16 * QS[t, b, 1]), sa, sb)
                dx = DX[t, b]
                q16 = _F32(16 * qx)
                qf = _F32(qx)
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = _F32(sa[g]) + _F32(sb[g]) + q16
                    a[g] += dx * (d[g] * _F32(sc[g]) * isum - dm[g] * _F32(mn[g]) * qf)
        _store(out, acc, grp)


@njit(**JIT)
def q6_k(W, D, SC, X, DX, QS, g0, g1, out):
    """Q6_K: value d * sc * (q - 32) per 16 elements, q in 0..63."""
    n, nb = DX.shape
    sa = np.empty(LANES, np.int32)
    sb = np.empty(LANES, np.int32)
    acc = np.empty((n, LANES), np.float32)
    for grp in range(g0, g1):
        acc[:] = 0
        for b in range(nb):
            d = D[grp, b >> 3]
            ca = SC[grp, 2 * b]
            cb = SC[grp, 2 * b + 1]
            for t in range(n):
                _lanes_bytes_halves(W[grp, b], X[t, b], sa, sb)
                oa = 32 * QS[t, b, 0]
                ob = 32 * QS[t, b, 1]
                dx = DX[t, b]
                a = acc[t]
                for g in range(a.shape[0]):
                    isum = np.int32(ca[g]) * (sa[g] - oa) + np.int32(cb[g]) * (sb[g] - ob)
                    a[g] += d[g] * (dx * _F32(isum))
        _store(out, acc, grp)
