"""Attention of one decode token over the cached rows of a layer (the causal attention op's fused part).

Shapes of the inner loops are what makes this fast (measured, 9 heads x 150 rows x 64 dims:
~55 us with one row at a time and scalar exp, ~25 us like this):
- per kv head, four key rows are dotted with each query head of its GQA group in one pass,
  and four value rows are accumulated at once into a local float32 accumulator (each
  64-wide vector loop has a fixed cost, so fewer, fatter loops);
- softmax uses `exp_shifted`, a vectorisable float32 exp (numba has no vector math library here).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT

_F32 = np.float32
_LOG2E = _F32(1.4426950408889634)
_LN2_HI = _F32(0.693359375)        # ln 2 split so that n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = _F32(-2.12194440e-4)
_EXP_MIN = _F32(-87.0)             # exp(-87) is still a normal float32


@njit(**JIT)
def visible_rows(kpos, ring, pos, window, rows):
    """Cache rows the query at `pos` sees, in rows[:count]; returns count.

    Plain slots hold position r at row r (rows 0..pos); rings record each row's position in
    kpos (-1: empty), and rows past a rewind hold positions > pos.
    """
    lo = pos - window if window > 0 else -1
    count = 0
    if ring:
        for r in range(kpos.shape[0]):
            p = kpos[r]
            if p >= 0 and p <= pos and p > lo:
                rows[count] = r
                count += 1
    else:
        for r in range(max(0, lo + 1), pos + 1):
            rows[count] = r
            count += 1
    return count


@njit(**JIT)
def exp_shifted(p, m, bits):
    """p[j] = exp(p[j] - m) in place for p[j] <= m; returns the sum. bits: int32 scratch like p.

    exp(x) = 2^n e^r with n = round(x / ln 2) and r = x - n ln 2 (|r| <= ln 2 / 2, Cody-Waite
    split); e^r by its degree-6 Taylor polynomial; relative error < 5e-7, a few float32
    ulp (tests/test_decode_attention.py); 2^n is built in the exponent bits. Both loops vectorise.
    """
    for j in range(p.shape[0]):
        x = max(p[j] - m, _EXP_MIN)
        n = np.floor(x * _LOG2E + _F32(0.5))
        r = (x - n * _LN2_HI) - n * _LN2_LO
        p[j] = _F32(1.0) + r * (_F32(1.0) + r * (_F32(0.5) + r * (_F32(1.0 / 6) + r * (
            _F32(1.0 / 24) + r * (_F32(1.0 / 120) + r * _F32(1.0 / 720))))))
        bits[j] = (np.int32(n) + np.int32(127)) << np.int32(23)
    two_n = bits.view(np.float32)
    tot = _F32(0.0)
    for j in range(p.shape[0]):
        p[j] *= two_n[j]
        tot += p[j]
    return tot


@njit(**JIT)
def _scores(q2, kc, rows, count, kv, group, sc, p):
    """p[g, j] = sc * q2[kv * group + g] . kc[rows[j], kv], four rows per pass."""
    j = 0
    while j + 4 <= count:
        k0, k1, k2, k3 = kc[rows[j], kv], kc[rows[j + 1], kv], kc[rows[j + 2], kv], kc[rows[j + 3], kv]
        for g in range(group):
            qg = q2[kv * group + g]
            s0 = s1 = s2 = s3 = _F32(0.0)
            for e in range(qg.shape[0]):
                x = qg[e]
                s0 += x * k0[e]
                s1 += x * k1[e]
                s2 += x * k2[e]
                s3 += x * k3[e]
            p[g, j], p[g, j + 1], p[g, j + 2], p[g, j + 3] = s0 * sc, s1 * sc, s2 * sc, s3 * sc
        j += 4
    for jj in range(j, count):
        kj = kc[rows[jj], kv]
        for g in range(group):
            qg = q2[kv * group + g]
            s = _F32(0.0)
            for e in range(qg.shape[0]):
                s += qg[e] * kj[e]
            p[g, jj] = s * sc


@njit(**JIT)
def _cap(p, count, c):
    """p[g, j] = c * tanh(p[g, j] / c) for the first `count` scores of every row g."""
    for g in range(p.shape[0]):
        for j in range(count):
            p[g, j] = c * np.tanh(p[g, j] / c)


@njit(**JIT)
def _mix(vc, rows, count, kv, p, acc):
    """acc[g] = sum_j p[g, j] * vc[rows[j], kv], four rows per pass."""
    acc[:] = 0
    j = 0
    while j + 4 <= count:
        v0, v1, v2, v3 = vc[rows[j], kv], vc[rows[j + 1], kv], vc[rows[j + 2], kv], vc[rows[j + 3], kv]
        for g in range(acc.shape[0]):
            w0, w1, w2, w3 = p[g, j], p[g, j + 1], p[g, j + 2], p[g, j + 3]
            a = acc[g]
            for e in range(a.shape[0]):
                a[e] += w0 * v0[e] + w1 * v1[e] + w2 * v2[e] + w3 * v3[e]
        j += 4
    for jj in range(j, count):
        vj = vc[rows[jj], kv]
        for g in range(acc.shape[0]):
            w = p[g, jj]
            a = acc[g]
            for e in range(a.shape[0]):
                a[e] += w * vj[e]


@njit(**JIT)
def _bias(p, count, kv, group, slopes, dist):
    """p[g, j] += slopes[kv * group + g] * dist[j] (ALiBi) for the first `count` scores of every row g."""
    for g in range(p.shape[0]):
        m = _F32(slopes[kv * group + g])
        for j in range(count):
            p[g, j] += m * dist[j]


@njit(**JIT)
def attend_biased(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, out):
    """attend_one with an ALiBi bias: after the scale and the cap, query head h adds slopes[h] * dist[j]
    to its score of row rows[j] (dist: key position - query position, float32 [count]; slopes float64
    [H], empty: no bias)."""
    n_kv, hd = kc.shape[1], kc.shape[2]
    vd = vc.shape[2]
    group = n_head // n_kv
    q2 = q.reshape(n_head, hd)
    p = np.empty((group, count), np.float32)
    bits = np.empty(count, np.int32)
    acc = np.empty((group, vd), np.float32)
    inv = np.empty(group, np.float32)
    for kv in range(n_kv):
        _scores(q2, kc, rows, count, kv, group, _F32(scale), p)
        if softcap > 0:
            _cap(p, count, _F32(softcap))
        if slopes.shape[0]:
            _bias(p, count, kv, group, slopes, dist)
        for g in range(group):
            pg = p[g]
            m = pg[0]
            for j in range(1, count):
                m = max(m, pg[j])
            inv[g] = _F32(1.0) / exp_shifted(pg, m, bits)
        _mix(vc, rows, count, kv, p, acc)
        o = out[kv * group * vd:(kv + 1) * group * vd]
        for g in range(group):
            for e in range(vd):
                o[g * vd + e] = acc[g, e] * inv[g]


@njit(**JIT)
def attend_one(q, kc, vc, rows, count, n_head, scale, softcap, out):
    """Grouped-query attention of one token: q [H * hd], cache kc [cap, KV, hd], vc [cap, KV, vd] -> out [H * vd].

    Softmax in float32 with max subtraction over the `count` rows listed in rows; scores are
    first capped to softcap * tanh(score / softcap) when softcap > 0.
    """
    attend_biased(q, kc, vc, rows, count, n_head, scale, softcap, np.empty(0, np.float64), np.empty(0, _F32), out)
