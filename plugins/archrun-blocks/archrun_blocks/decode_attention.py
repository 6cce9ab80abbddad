"""Attention of one decode token over the cached rows of a layer (the causal attention op's fused part).

Shapes of the inner loops are what makes this fast (measured, 9 heads x 150 rows x 64 dims:
~55 us with one row at a time and scalar exp, ~25 us like this):
- per kv head, four key rows are dotted with each query head of its GQA group in one pass,
  and four value rows are accumulated at once into a local float32 accumulator (each
  64-wide vector loop has a fixed cost, so fewer, fatter loops);
- softmax uses `exp_shifted`, a vectorisable float32 exp (numba has no vector math library here);
- keys go in blocks of KEY_BLOCK rows with an online softmax, so long contexts need no scratch
  growing with the depth, and caches of other kv types (archrun_blocks.kv_codec) are decoded one
  block at a time into float32 rows that the same loops read.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from archrun.kernels._jit import JIT
from archrun_blocks.kv_codec import load_row

_F32 = np.float32
_LOG2E = _F32(1.4426950408889634)
_LN2_HI = _F32(0.693359375)        # ln 2 split so that n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = _F32(-2.12194440e-4)
_EXP_MIN = _F32(-87.0)             # exp(-87) is still a normal float32
# keys per block of the online softmax: the scores [group, KEY_BLOCK] and a block of decoded K/V rows
# ([KEY_BLOCK, KV, hd] float32 each, other kv types) stay in the core's cache
KEY_BLOCK = 256


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
    """acc[g] += sum_j p[g, j] * vc[rows[j], kv], four rows per pass."""
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


def block_rows(c, rows, j0, n, scratch, ident):
    """(matrix, rows) holding cache rows rows[j0:j0 + n] of c as float32: a float32 cache as it is
    (no copy), any other kv type decoded into scratch float32 [>= n, KV, width] (rows ident[:n])."""
    if c.dtype == np.float32:
        return c, rows[j0:j0 + n]
    for t in range(n):
        for h in range(c.shape[1]):
            load_row(c[rows[j0 + t], h], scratch[t, h])
    return scratch, ident[:n]


@overload(block_rows, jit_options=JIT)
def _block_rows_typed(c, rows, j0, n, scratch, ident):
    if c.dtype == types.float32:
        return lambda c, rows, j0, n, scratch, ident: (c, rows[j0:j0 + n])

    def decoded(c, rows, j0, n, scratch, ident):
        for t in range(n):
            for h in range(c.shape[1]):
                load_row(c[rows[j0 + t], h], scratch[t, h])
        return scratch, ident[:n]

    return decoded


def scratch_rows(c, nb) -> int:
    """How many decoded rows block_rows needs for cache array c: 0 for float32 (read in place)."""
    return 0 if c.dtype == np.float32 else nb


@overload(scratch_rows, jit_options=JIT)
def _scratch_rows_typed(c, nb):
    if c.dtype == types.float32:
        return lambda c, nb: 0
    return lambda c, nb: nb


@njit(**JIT)
def _rescale(acc, l, h, factor):
    """Scale head h's running softmax sum and value accumulator by factor (a new, larger max)."""
    l[h] *= factor
    a = acc[h]
    for e in range(a.shape[0]):
        a[e] *= factor


@njit(**JIT)
def attend_biased(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, out):
    """Grouped-query attention of one token over cache rows rows[:count]: q [H * hd], kc [cap, KV, *],
    vc [cap, KV, *] of any kv type (archrun_blocks.kv_codec) -> out [H * vd], with an ALiBi bias:
    after the scale and the cap, query head h adds slopes[h] * dist[j] to its score of row rows[j]
    (dist: key position - query position, float32 [count]; slopes float64 [H], empty: no bias).

    Keys go in blocks of KEY_BLOCK rows with an online softmax (a running max, sum and value
    accumulator per head, rescaled when a block raises the max), so the scores' scratch stays
    small at any depth and a cache of another kv type is decoded a block at a time. Up to
    KEY_BLOCK rows this is exactly the one-pass softmax.
    """
    n_kv = kc.shape[1]
    hd, vd = q.shape[0] // n_head, out.shape[0] // n_head
    group = n_head // n_kv
    q2 = q.reshape(n_head, hd)
    nb = min(count, KEY_BLOCK)
    p = np.empty((group, nb), np.float32)
    bits = np.empty(nb, np.int32)
    mx = np.empty(n_head, np.float32)
    tot = np.zeros(n_head, np.float32)
    acc = np.zeros((n_head, vd), np.float32)
    kb = np.empty((scratch_rows(kc, nb), n_kv, hd), np.float32)
    vb = np.empty((scratch_rows(vc, nb), n_kv, vd), np.float32)
    ident = np.arange(nb)
    for j0 in range(0, count, KEY_BLOCK):
        n = min(KEY_BLOCK, count - j0)
        km, kr = block_rows(kc, rows, j0, n, kb, ident)
        vm, vr = block_rows(vc, rows, j0, n, vb, ident)
        for kv in range(n_kv):
            _scores(q2, km, kr, n, kv, group, _F32(scale), p)
            if softcap > 0:
                _cap(p, n, _F32(softcap))
            if slopes.shape[0]:
                _bias(p, n, kv, group, slopes, dist[j0:j0 + n])
            for g in range(group):
                h = kv * group + g
                pg = p[g][:n]
                m = pg[0]
                for j in range(1, n):
                    m = max(m, pg[j])
                if j0 == 0:
                    mx[h] = m
                elif m > mx[h]:
                    _rescale(acc, tot, h, _F32(math.exp(mx[h] - m)))
                    mx[h] = m
                tot[h] += exp_shifted(pg, mx[h], bits[:n])
            _mix(vm, vr, n, kv, p, acc[kv * group:(kv + 1) * group])
    for h in range(n_head):
        inv = _F32(1.0) / tot[h]
        o = out[h * vd:(h + 1) * vd]
        for e in range(vd):
            o[e] = acc[h, e] * inv


@njit(**JIT)
def attend_one(q, kc, vc, rows, count, n_head, scale, softcap, out):
    """Grouped-query attention of one token: q [H * hd], cache kc [cap, KV, *], vc [cap, KV, *] (any kv
    type) -> out [H * vd].

    Softmax in float32 with max subtraction over the `count` rows listed in rows; scores are
    first capped to softcap * tanh(score / softcap) when softcap > 0.
    """
    attend_biased(q, kc, vc, rows, count, n_head, scale, softcap, np.empty(0, np.float64), np.empty(0, _F32), out)
