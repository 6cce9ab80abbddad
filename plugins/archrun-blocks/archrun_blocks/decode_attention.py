"""Attention of one decode token over the cached rows of a layer (the causal attention op's fused part).

Shapes of the inner loops are what makes this fast (measured, 9 heads x 150 rows x 64 dims:
~55 us with one row at a time and scalar exp, ~25 us like this):
- four key rows are dotted with two or three query heads of a GQA group in one pass (tile_simd's
  dots4x2 / dots4x3), and value rows are accumulated into register tiles of 4 (or 3) heads x 16
  columns (mm4x16_acc / mm3x16_acc), or four rows at a time into a float32 accumulator;
- the cache is read front to back: rows outer, every kv head of a row before the next row, and the
  loops prefetch the rows they read next (SCORE_AHEAD, MIX_ROWS, MIX_AHEAD: a long context's K/V comes
  from memory, and this lets it stream while the loops compute);
- softmax uses `exp_shifted`, a vectorisable float32 exp (numba has no vector math library here);
- keys go in blocks of KEY_BLOCK rows with an online softmax, so long contexts need no scratch
  growing with the depth, and caches of other kv types (archrun_blocks.kv_codec) are decoded one
  block at a time into float32 rows that the same loops read.

More than SPLIT_MIN_ROWS visible rows go in chunks of CHUNK_ROWS rows (`attend_split`): each
chunk's online softmax gives per-head partials (max, sum, value accumulator), merged in chunk order
with the log-sum-exp rule. Chunk boundaries and the merge order depend only on the number of visible
rows; up to SPLIT_MIN_ROWS rows the one-pass code (attend_biased) runs.

When a decode pool runs (archrun.kernels.decode.pool), `attend_split` shares the work with the step's
other threads as the pool's task `attend_chunk`, at any number of rows: up to SPLIT_MIN_ROWS rows by kv
head (each chunk a range of kv heads: their query heads' whole online softmax over the rows, finished
straight into their slices of the output; a range holds enough kv heads for SHARE_MIN_WORK multiply-adds,
as smaller chunks cost more to hand over than they save), past it by row chunk (each chunk every kv head
of its rows, whole rows read front to back, writing its partials, merged per head in row-chunk order by
the caller). A kv head's scores, value-mix tiles and sums are its own (every scratch buffer is a chunk's),
so a head has the same bits in any chunk, and the result is the same bits on any number of threads and
with no pool.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from archrun.kernels import atomics
from archrun.kernels._jit import JIT
from archrun.kernels.decode import pool
from archrun.kernels.decode.addresses import address, array_at, get_float, put_float
from archrun.kernels.decode.parts import SIGNATURES
from archrun_blocks.kv_codec import load_heads
from archrun_blocks.tile_simd import COLS, ROWS, dots4x2, dots4x3, mm3x16_acc, mm4x16_acc

_F32 = np.float32
_LOG2E = _F32(1.4426950408889634)
_LN2_HI = _F32(0.693359375)        # ln 2 split so that n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = _F32(-2.12194440e-4)
_EXP_MIN = _F32(-87.0)             # exp(-87) is still a normal float32
# keys per block of the online softmax: the scores [group, KEY_BLOCK] and a block of decoded K/V rows
# ([KEY_BLOCK, KV, hd] float32 each, other kv types) stay in the core's cache
KEY_BLOCK = 256
# the rows of a chunk (attend_split), and the visible rows above which the keys go in chunks: a chunk of
# 128 f32 rows of 3 kv heads of 64 is ~200 KB, ~45 us of streaming from memory on one thread against a few
# us to hand it to the pool and ~1 us to merge its partials; past one chunk the step's second core helps
# (a layer's K/V is cold at any depth: the weights streamed since evicted it)
CHUNK_ROWS = 128
SPLIT_MIN_ROWS = CHUNK_ROWS
# how the loops read a layer's K/V rows (float32 or f16 rows in place; measured on Zen 4, 9 heads over 3 kv heads
# of 64, 4096 rows, 30 layers' caches from memory, one thread): rows go outer and every kv head of a row is
# read before the next row, so the cache is read front to back once; and the loops prefetch the rows they read
# next. A per-kv-head pass over a block of rows with the whole block prefetched first read ~6 GB/s (the
# memory sat idle while the block was computed); this reads ~15 GB/s, near a plain stream (~20 GB/s).
# Prefetching further ahead into the first level did worse (rows 16 ahead ~12, 64 ahead ~10 GB/s: they
# evict the rows in use); the value mix's short runs also ask the second level for the rows further on.
SCORE_AHEAD = 4     # rows the scores prefetch past their quad
MIX_ROWS = 8        # rows of a run of the value-mix tiles (and prefetched past it)
MIX_AHEAD = 64      # rows past the next run that the value mix asks the second-level cache for
_IDENT = np.arange(KEY_BLOCK)  # the rows of a decoded block (a constant of the compiled code)
_NO_SINKS = np.empty(0, np.float64)  # attention without sink logits


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


def _scores_direct(q2, kc, rows, count, k0, k1, group, sc, p):
    """p[kv - k0, g, j] = sc * q2[kv * group + g] . kc[rows[j], kv] for kv heads k0..k1-1, straight from the
    cache rows (float32, or f16 bits widened in registers: no decoded copy), four rows x three heads per dots4x3
    or two per dots4x2 (a group's last 4 heads in pairs, a single last head paired with itself; a short last
    quad repeats its last row): every score's bits are its own dot's, whichever tile computed it. Rows go outer, the
    kv heads inner, and the next rows are prefetched (_ahead): the cache is read front to back once (see
    SCORE_AHEAD). For head widths that are multiples of 8."""
    out = np.empty(12, _F32)
    for j in range(0, count, 4):
        r = (rows[j], rows[min(j + 1, count - 1)], rows[min(j + 2, count - 1)], rows[min(j + 3, count - 1)])
        _ahead(kc, r[3] + 1, SCORE_AHEAD, k0, k1)
        m = min(4, count - j)
        for kv in range(k0, k1):
            g0 = kv * group
            pk = p[kv - k0]
            g = 0
            while g < group:
                left = group - g
                if left == 3 or left >= 5:  # threes, and the last 4, 2 or 1 heads in pairs
                    dots4x3(q2[g0 + g], q2[g0 + g + 1], q2[g0 + g + 2], kc[r[0], kv], kc[r[1], kv], kc[r[2], kv],
                            kc[r[3], kv], out)
                    for i in range(m):
                        pk[g, j + i] = out[i] * sc
                        pk[g + 1, j + i] = out[4 + i] * sc
                        pk[g + 2, j + i] = out[8 + i] * sc
                    g += 3
                    continue
                g1 = min(g + 1, group - 1)
                dots4x2(q2[g0 + g], q2[g0 + g1], kc[r[0], kv], kc[r[1], kv], kc[r[2], kv], kc[r[3], kv], out)
                for i in range(m):
                    pk[g, j + i] = out[i] * sc
                    pk[g1, j + i] = out[4 + i] * sc
                g += 2


@overload(_scores_direct, jit_options=JIT)
def _scores_direct_typed(q2, kc, rows, count, k0, k1, group, sc, p):
    if kc.dtype not in (types.float32, types.uint16):  # q8_0 rows are decoded first (never called)
        return lambda q2, kc, rows, count, k0, k1, group, sc, p: None
    return _scores_direct


def direct_keys(c, hd) -> bool:
    """Whether the scores read cache array c's key rows in place (_scores_direct): float32 or f16 rows of a
    width that is a multiple of 8; q8_0 rows are decoded a block at a time."""
    return c.dtype in (np.float32, np.uint16) and hd % 8 == 0


@overload(direct_keys, jit_options=JIT)
def _direct_keys_typed(c, hd):
    if c.dtype in (types.float32, types.uint16):
        return lambda c, hd: hd % 8 == 0
    return lambda c, hd: False


@njit(**JIT)
def _cap(p, group, count, c):
    """p[g, j] = c * tanh(p[g, j] / c) for the first `count` scores of rows g < group."""
    for g in range(group):
        for j in range(count):
            p[g, j] = c * np.tanh(p[g, j] / c)


@njit(**JIT)
def _mix4(vc, rows, j, kv, p, acc):
    """acc[g] += sum of p[g, j + i] * vc[rows[j + i], kv] over the four rows i < 4, in one pass."""
    v0, v1, v2, v3 = vc[rows[j], kv], vc[rows[j + 1], kv], vc[rows[j + 2], kv], vc[rows[j + 3], kv]
    for g in range(acc.shape[0]):
        w0, w1, w2, w3 = p[g, j], p[g, j + 1], p[g, j + 2], p[g, j + 3]
        a = acc[g]
        for e in range(a.shape[0]):
            a[e] += w0 * v0[e] + w1 * v1[e] + w2 * v2[e] + w3 * v3[e]


@njit(**JIT)
def _mix(vc, rows, count, k0, k1, p, acc):
    """acc[kv - k0, g] += sum_j p[kv - k0, g, j] * vc[rows[j], kv] for kv heads k0..k1-1: four rows per pass
    (_mix4), rows outer and the next ones prefetched, then the last count % 4 rows one at a time."""
    j = 0
    while j + 4 <= count:
        _ahead(vc, rows[j + 3] + 1, 4, k0, k1)
        for kv in range(k0, k1):
            _mix4(vc, rows, j, kv, p[kv - k0], acc[kv - k0])
        j += 4
    for kv in range(k0, k1):
        a_kv, p_kv = acc[kv - k0], p[kv - k0]
        for jj in range(j, count):
            vj = vc[rows[jj], kv]
            for g in range(a_kv.shape[0]):
                w = p_kv[g, jj]
                a = a_kv[g]
                for e in range(a.shape[0]):
                    a[e] += w * vj[e]


@njit(**JIT)
def _mix_tiles(vc, rows, count, k0, k1, group, p, acc):
    """_mix over tiles of 4 heads x 16 value columns held in registers (tile_simd.mm4x16_acc) when the rows are
    consecutive cache rows (a plain slot, a ring's unwrapped stretch, every decoded block) and the value width
    is a multiple of 16: acc [k1 - k0, G4, vd] and p [k1 - k0, G4, >= count] with G4 the group size rounded up
    to a multiple of 4 (padding rows of p zero; a last 3 heads take tile_simd.mm3x16_acc, without one); else
    _mix itself. The rows go in runs of MIX_ROWS, every kv head's tiles over one run
    before the next (each output's multiply-adds stay in row order: the bits of one tile over all the rows),
    with the next runs prefetched (MIX_AHEAD)."""
    vd = acc.shape[2]
    r0 = rows[0]
    if vd % COLS != 0 or rows[count - 1] - r0 != count - 1:
        _mix(vc, rows, count, k0, k1, p, acc)
        return
    for s0 in range(0, count, MIX_ROWS):
        s1 = min(count, s0 + MIX_ROWS)
        _ahead(vc, r0 + s1, MIX_ROWS, k0, k1)
        _ahead(vc, r0 + s1 + MIX_AHEAD, MIX_ROWS, k0, k1, True)
        for kv in range(k0, k1):
            a, pk = acc[kv - k0], p[kv - k0]
            vk = vc[r0 + s0:r0 + s1, kv]
            for g in range(0, group, ROWS):
                pg, ag = pk[g:g + ROWS, s0:s1], a[g:g + ROWS]
                if group - g == 3:
                    for e in range(0, vd, COLS):
                        mm3x16_acc(pg[:3], vk[:, e:e + COLS], ag[:3, e:e + COLS])
                else:
                    for e in range(0, vd, COLS):
                        mm4x16_acc(pg, vk[:, e:e + COLS], ag[:, e:e + COLS])


@njit(**JIT)
def _bias(p, count, kv, group, slopes, dist):
    """p[g, j] += slopes[kv * group + g] * dist[j] (ALiBi) for the first `count` scores of rows g < group."""
    for g in range(group):
        m = _F32(slopes[kv * group + g])
        for j in range(count):
            p[g, j] += m * dist[j]


def block_rows(c, rows, j0, n, scratch, ident, k0, k1):
    """(matrix, rows) holding cache rows rows[j0:j0 + n] of c as float32 (kv heads k0..k1-1 at least): a float32
    cache as it is (no copy), any other kv type's heads k0..k1-1 decoded into scratch float32 [>= n, KV, width]
    (rows ident[:n]; its other heads untouched)."""
    if c.dtype == np.float32:
        return c, rows[j0:j0 + n]
    load_heads(c, rows, j0, n, k0, k1, scratch)
    return scratch, ident[:n]


@overload(block_rows, jit_options=JIT)
def _block_rows_typed(c, rows, j0, n, scratch, ident, k0, k1):
    if c.dtype == types.float32:
        return lambda c, rows, j0, n, scratch, ident, k0, k1: (c, rows[j0:j0 + n])

    def decoded(c, rows, j0, n, scratch, ident, k0, k1):
        load_heads(c, rows, j0, n, k0, k1, scratch)
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
def _ahead(c, r, n, k0, k1, l2=False):
    """Prefetch cache rows r..r+n-1 of c [cap, KV, w] (kv heads k0..k1-1; rows past the array skipped) into
    the first-level cache, or with l2 the second: the rows the loops read next (a hint: rows of a ring past
    its wrap, or of the next chunk, are simply not used soon). One loop walks the lines in address order:
    written as two nested loops, LLVM unrolled the inner one into bursts of prefetches that did nothing
    measurable (Zen 4: scores over cold rows 440-500 us a layer with them, 490 without, 170 like this)."""
    width, w = c.shape[1] * c.shape[2], c.shape[2]
    step = 64 // c.itemsize
    j0, j1 = max(r, 0), min(r + n, c.shape[0])
    if j1 <= j0:
        return
    lo, hi = k0 * w, k1 * w
    e, o, end = j0 * width + lo, lo, (j1 - 1) * width + hi
    while e < end:
        if l2:
            atomics.prefetch_l2(c, e)
        else:
            atomics.prefetch(c, e)
        e += step
        o += step
        if o >= hi:
            o = lo
            e += width - (hi - lo)


@njit(**JIT)
def _rescale(acc, l, g, h, factor):
    """Scale head h's running softmax sum l[h] and value accumulator acc[g] by factor (a new, larger max)."""
    l[h] *= factor
    a = acc[g]
    for e in range(a.shape[0]):
        a[e] *= factor


@njit(**JIT)
def attend_one(q, kc, vc, rows, count, n_head, scale, softcap, out):
    """Grouped-query attention of one token: q [H * hd], cache kc [cap, KV, *], vc [cap, KV, *] (any kv
    type) -> out [H * vd].

    Softmax in float32 with max subtraction over the `count` rows listed in rows; scores are
    first capped to softcap * tanh(score / softcap) when softcap > 0.
    """
    attend_biased(q, kc, vc, rows, count, n_head, scale, softcap, np.empty(0, np.float64), np.empty(0, _F32), out)


@njit(**JIT)
def _partial(q2, kc, vc, rows, count, k0, k1, scale, softcap, slopes, dist, mx, tot, acc):
    """The online softmax of q2 [H, hd] over rows[:count] before its final division, for the query heads of kv
    heads k0..k1-1: per such head h the max score mx[h], the sum tot[h] of exp(score - mx[h]) and acc[h] [vd]
    = sum of exp(score - mx[h]) v (attend_biased divides them; attend_split's chunks each give theirs, merged
    in chunk order). A kv head's arithmetic is the same whichever range it is computed in (its scores, tiles
    and sums are its own): a range's heads get the bits of the whole call's."""
    n_head, hd = q2.shape
    n_kv, vd = kc.shape[1], acc.shape[1]
    group = n_head // n_kv
    nb = min(count, KEY_BLOCK)
    # the value mix in register tiles of 4 heads (_mix_tiles) from groups of 3 heads on: each kv head's
    # accumulators padded to a multiple of 4 rows (padding rows of p stay zero); smaller groups as they are
    gt = (group + ROWS - 1) // ROWS * ROWS if group >= 3 else group
    # one allocation a call (a long context's split makes one call per chunk of 128 rows): the scores p [gt, nb],
    # the accumulators [n_kv, gt, vd], exp's bits [nb] and the decoded K/V blocks (kv types other than f32)
    direct = direct_keys(kc, hd)
    nk, nv = 0 if direct else scratch_rows(kc, nb), scratch_rows(vc, nb)
    nr = k1 - k0
    n_p, n_a = nr * gt * nb, nr * gt * vd
    buf = np.empty(n_p + n_a + nb + (nk * hd + nv * vd) * n_kv, np.float32)
    buf[:n_p + n_a] = 0.0
    p_kv = buf[:n_p].reshape((nr, gt, nb))
    a_kv = buf[n_p:n_p + n_a].reshape((nr, gt, vd))
    o = n_p + n_a + nb
    bits = buf[n_p + n_a:o].view(np.int32)
    kb = buf[o:o + nk * n_kv * hd].reshape((nk, n_kv, hd))
    vb = buf[o + nk * n_kv * hd:].reshape((nv, n_kv, vd))
    tot[k0 * group:k1 * group] = 0.0
    ident = _IDENT
    for j0 in range(0, count, KEY_BLOCK):
        n = min(KEY_BLOCK, count - j0)
        if direct:
            _scores_direct(q2, kc, rows[j0:j0 + n], n, k0, k1, group, _F32(scale), p_kv)
        else:
            km, kr = block_rows(kc, rows, j0, n, kb, ident, k0, k1)
            for kv in range(k0, k1):
                _scores(q2, km, kr, n, kv, group, _F32(scale), p_kv[kv - k0])
        vm, vr = block_rows(vc, rows, j0, n, vb, ident, k0, k1)
        for kv in range(k0, k1):
            a, p = a_kv[kv - k0], p_kv[kv - k0]
            if softcap > 0:
                _cap(p, group, n, _F32(softcap))
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
                    _rescale(a, tot, g, h, _F32(math.exp(mx[h] - m)))
                    mx[h] = m
                tot[h] += exp_shifted(pg, mx[h], bits[:n])
        if gt > group:
            _mix_tiles(vm, vr, n, k0, k1, group, p_kv, a_kv)
        else:
            _mix(vm, vr, n, k0, k1, p_kv, a_kv)
    for h in range(k0 * group, k1 * group):
        acc[h] = a_kv[h // group - k0, h % group]


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
    attend_sinks(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, _NO_SINKS, out)


@njit(**JIT)
def _sink_term(mx, sink):
    """(w, e) for a head whose partials have max mx and whose softmax also counts the sink logit `sink`
    (float64): with m = max(mx, sink), w = exp(mx - m) rescales the partials, e = exp(sink - m) joins the sum."""
    m = max(np.float64(mx), sink)
    return _F32(math.exp(np.float64(mx) - m)), _F32(math.exp(sink - m))


@njit(**JIT)
def attend_sinks(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, sinks, out):
    """attend_biased where head h's softmax also counts a learned sink logit sinks[h] (float64 [H], empty:
    none; gpt-oss): it takes probability mass and adds no value. The rows' online softmax as there, then per
    head w, e = _sink_term(max, sink): out = (w acc) / (w sum + e) (w = 1 when the sink is below the max)."""
    vd = out.shape[0] // n_head
    mx = np.empty(n_head, _F32)
    tot = np.empty(n_head, _F32)
    acc = np.empty((n_head, vd), _F32)
    _partial(q.reshape(n_head, q.shape[0] // n_head), kc, vc, rows, count, 0, kc.shape[1], scale, softcap, slopes,
             dist, mx, tot, acc)
    _finish(mx, tot, acc, sinks, 0, n_head, out)


@njit(**JIT)
def _finish(mx, tot, acc, sinks, h0, h1, out):
    """out's heads h0..h1-1 from their one-pass partials (attend_sinks): acc / sum, with a sink's term."""
    vd = acc.shape[1]
    for h in range(h0, h1):
        o = out[h * vd:(h + 1) * vd]
        if sinks.shape[0]:
            w, e = _sink_term(mx[h], sinks[h])
            inv = _F32(1.0) / (tot[h] * w + e)
            for j in range(vd):
                o[j] = (acc[h, j] * w) * inv
            continue
        inv = _F32(1.0) / tot[h]
        for j in range(vd):
            o[j] = acc[h, j] * inv


# -- sharing with the decode pool: kv heads, and past SPLIT_MIN_ROWS rows chunks of keys -----------------------
# attend_chunk's arguments (int64 [N_ARGS]: addresses of the caller's arrays, integers, float64 bits):
# q f32 [H, hd], rows int64 [count], slopes f64 [n_slopes], dist f32 [count or 0], the partials
# mx / tot f32 [chunks, H] and acc f32 [chunks, H, vd] (row chunks), the caches [cap, KV, stored] of kind
# (itemsize: 4 float32, 2 float16 bits, 1 q8_0 bytes), the kv-head ranges per row chunk, sinks f64
# [n_sinks] and out f32 [H * vd] (up to SPLIT_MIN_ROWS rows: each chunk finishes its heads there)
(A_Q, A_ROWS, A_COUNT, A_HEADS, A_HD, A_VD, A_SCALE, A_SOFTCAP, A_SLOPES, A_NSLOPES, A_DIST, A_MX, A_TOT, A_ACC,
 A_KC, A_VC, A_CAP, A_KV, A_KW, A_VW, A_KIND, A_RANGES, A_SINKS, A_NSINKS, A_OUT, N_ARGS) = range(26)
# the least work of a shared chunk, in multiply-adds (rows x query heads x (hd + vd)): a chunk has a fixed cost
# of ~1.5 us (its call, scratch and the hand-off), so smaller ones stay whole. Measured (_partial, one thread,
# warm caches, 3 query heads per kv head, hd = vd = 64, float32 cache): one kv head at 8 / 32 / 64 / 128 rows
# 1.8 / 2.4 / 3.2 / 5.0 us, all three 2.7 / 4.4 / 6.6 / 12.0 us; in a model's step the rows come cold
# from memory (~3x that). From 64 such rows on every kv head is a chunk of its own
SHARE_MIN_WORK = 64 * 3 * 128


@njit(**JIT)
def chunk_rows(count):
    """Rows per chunk of a split over `count` rows: CHUNK_ROWS, or the multiple of it that keeps the chunks
    within the pool's MAX_CHUNKS (past ~32k rows). A function of count alone: the same chunks, so the same
    bits, on any number of threads."""
    span = CHUNK_ROWS * pool.MAX_CHUNKS
    return CHUNK_ROWS * ((count + span - 1) // span)


@njit(**JIT)
def kv_ranges(count, row_chunks, n_head, n_kv, hd, vd):
    """Ranges of kv heads to share each of `row_chunks` chunks of keys (count rows in all) in. Past one row
    chunk, 1: a chunk takes whole cache rows, read front to back (SmolLM2, 4096 cached rows, 2 threads on
    Zen 4: 60 tok/s, against 38 with every row chunk cut into its 3 kv heads, whose chunks read a third of
    each row and ran slower on two threads than whole rows on one). Within one row chunk (up to
    SPLIT_MIN_ROWS rows, a short context) every kv head alone, or fewer ranges of several so that a range's
    work reaches SHARE_MIN_WORK (1: the kv heads stay together), within the pool's MAX_CHUNKS. Any ranges give
    the same bits (each kv head's arithmetic is its own, see _partial): this only decides how the work is
    shared."""
    if row_chunks >= 2:
        return 1
    per_head = count * (n_head // n_kv) * (hd + vd)  # multiply-adds of one kv head's query heads
    per = max(1, (SHARE_MIN_WORK + per_head - 1) // per_head)  # kv heads per range
    ranges = (n_kv + per - 1) // per
    return max(1, min(ranges, pool.MAX_CHUNKS))


@njit(**JIT)
def _chunk(args, c, kc, vc):
    """Chunk c of a shared attention (arguments: A_*): kv-head range c % A_RANGES of row chunk c // A_RANGES.
    Up to SPLIT_MIN_ROWS rows (one row chunk) the range's heads are finished into out with attend_sinks'
    arithmetic; past it the range's partials of the row chunk's chunk_rows(count) rows, merged by the caller."""
    count, n_head, vd, ranges = args[A_COUNT], args[A_HEADS], args[A_VD], args[A_RANGES]
    n_kv = kc.shape[1]
    group = n_head // n_kv
    rc, kr = c // ranges, c % ranges
    k0, k1 = kr * n_kv // ranges, (kr + 1) * n_kv // ranges
    rows = array_at(args[A_ROWS], (count,), np.int64)
    slopes = array_at(args[A_SLOPES], (args[A_NSLOPES],), np.float64)
    dist = array_at(args[A_DIST], (count if args[A_NSLOPES] else 0,), np.float32)
    q2 = array_at(args[A_Q], (n_head, args[A_HD]), np.float32)
    scale, softcap = get_float(args, A_SCALE), get_float(args, A_SOFTCAP)
    if count <= SPLIT_MIN_ROWS:
        mx = np.empty(n_head, _F32)
        tot = np.empty(n_head, _F32)
        acc = np.empty((n_head, vd), _F32)
        _partial(q2, kc, vc, rows, count, k0, k1, scale, softcap, slopes, dist, mx, tot, acc)
        _finish(mx, tot, acc, array_at(args[A_SINKS], (args[A_NSINKS],), np.float64), k0 * group, k1 * group,
                array_at(args[A_OUT], (n_head * vd,), np.float32))
        return
    size = chunk_rows(count)
    nch = (count + size - 1) // size
    j0 = rc * size
    n = min(size, count - j0)
    d0, d1 = min(j0, dist.shape[0]), min(j0 + n, dist.shape[0])
    _partial(q2, kc, vc, rows[j0:j0 + n], n, k0, k1, scale, softcap, slopes, dist[d0:d1],
             array_at(args[A_MX], (nch, n_head), np.float32)[rc], array_at(args[A_TOT], (nch, n_head), np.float32)[rc],
             array_at(args[A_ACC], (nch, n_head, vd), np.float32)[rc])


@njit(SIGNATURES["task"], **JIT)
def attend_chunk(args, c):
    """The decode pool's task of a shared attention: chunk c, the caches rebuilt from args (see A_*)."""
    ks, vs = (args[A_CAP], args[A_KV], args[A_KW]), (args[A_CAP], args[A_KV], args[A_VW])
    kind = args[A_KIND]
    if kind == 4:
        _chunk(args, c, array_at(args[A_KC], ks, np.float32), array_at(args[A_VC], vs, np.float32))
    elif kind == 2:
        _chunk(args, c, array_at(args[A_KC], ks, np.uint16), array_at(args[A_VC], vs, np.uint16))
    else:
        _chunk(args, c, array_at(args[A_KC], ks, np.uint8), array_at(args[A_VC], vs, np.uint8))


@njit(**JIT)
def _merge(mx, tot, acc, sinks, out):
    """out[h] = sum_c w_c acc[c, h] / sum_c w_c tot[c, h], w_c = exp(mx[c, h] - max_c mx[c, h]), summed in
    chunk order (the log-sum-exp rule); with sinks (float64 [H], empty: none) the max also takes sinks[h]
    and the sum, last, exp(sinks[h] - max) (attend_sinks)."""
    nch, n_head, vd = acc.shape
    a = np.empty(vd, _F32)
    for h in range(n_head):
        m = mx[0, h]
        for c in range(1, nch):
            m = max(m, mx[c, h])
        if sinks.shape[0]:
            m = max(m, _F32(sinks[h]))
        total = _F32(0.0)
        a[:] = 0.0
        for c in range(nch):
            w = _F32(math.exp(mx[c, h] - m))
            total += tot[c, h] * w
            for e in range(vd):
                a[e] += acc[c, h, e] * w
        if sinks.shape[0]:
            total += _F32(math.exp(sinks[h] - np.float64(m)))
        inv = _F32(1.0) / total
        o = out[h * vd:(h + 1) * vd]
        for e in range(vd):
            o[e] = a[e] * inv


@njit(**JIT)
def attend_split(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, out, ctrl, task):
    """attend_biased (same arguments), shared with the running decode pool `ctrl` (archrun.kernels.decode.pool;
    empty: none) as its task `task` (-1: none) unless the pool backs off after a stall (pool.share_task): by
    kv head, and past SPLIT_MIN_ROWS rows in chunks of chunk_rows(count) rows merged in chunk order (also
    without a pool). Up to SPLIT_MIN_ROWS rows the bits of attend_biased, past it those of the chunks' merge,
    on any number of threads. q, rows, slopes, dist, out C-contiguous."""
    split_sinks(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, _NO_SINKS, out, ctrl, task)


@njit(**JIT)
def split_sinks(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, sinks, out, ctrl, task):
    """attend_split with sink logits sinks (float64 [H], empty: none; C-contiguous): up to SPLIT_MIN_ROWS rows
    attend_sinks' bits, past it counted when the chunks merge."""
    hd, vd = q.shape[0] // n_head, out.shape[0] // n_head
    one_pass = count <= SPLIT_MIN_ROWS
    size = chunk_rows(count)
    nch = 1 if one_pass else (count + size - 1) // size
    ranges = kv_ranges(count, nch, n_head, kc.shape[1], hd, vd) if task >= 0 else 1
    shared = task >= 0 and nch * ranges >= 2 and nch * ranges <= pool.MAX_CHUNKS and pool.share_task(ctrl)
    if one_pass and not shared:
        attend_sinks(q, kc, vc, rows, count, n_head, scale, softcap, slopes, dist, sinks, out)
        return
    mx = np.empty((nch, n_head), _F32)
    tot = np.empty((nch, n_head), _F32)
    acc = np.empty((nch, n_head, vd), _F32)
    args = np.zeros(N_ARGS, np.int64)
    args[A_Q], args[A_ROWS], args[A_COUNT], args[A_HEADS], args[A_HD], args[A_VD] = (
        address(q), address(rows), count, n_head, hd, vd)
    put_float(args, A_SCALE, scale)
    put_float(args, A_SOFTCAP, softcap)
    args[A_SLOPES], args[A_NSLOPES], args[A_DIST] = address(slopes), slopes.shape[0], address(dist)
    args[A_MX], args[A_TOT], args[A_ACC] = address(mx), address(tot), address(acc)
    args[A_KC], args[A_VC], args[A_CAP], args[A_KV] = address(kc), address(vc), kc.shape[0], kc.shape[1]
    args[A_KW], args[A_VW], args[A_KIND] = kc.shape[2], vc.shape[2], kc.itemsize
    args[A_SINKS], args[A_NSINKS], args[A_OUT] = address(sinks), sinks.shape[0], address(out)
    if shared:
        args[A_RANGES] = ranges
        n = nch * ranges
        shared_args = pool.publish_task(ctrl, task, args, n)
        while True:
            c = pool.next_chunk(ctrl)
            if c < 0:
                break
            _chunk(shared_args, c, kc, vc)
            pool.done(ctrl)
        pool.wait_task(ctrl, n)  # after a long wait (an overloaded host) the next tasks stay here
    else:
        args[A_RANGES] = 1
        for c in range(nch):
            _chunk(args, c, kc, vc)
    if not one_pass:
        _merge(mx, tot, acc, sinks, out)
