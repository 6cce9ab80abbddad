"""Attention of many queries at once (long prompts): tiles of queries x keys with an online softmax.

The per-query path (elementwise._attend_query: the decode part's attention for each query) reads
every visible key and value row once per query: a 4096-token prompt reads a layer's K/V 4096
times, from L2/L3, at ~4-5 G multiply-adds/s a thread. Here a tile of QBLK queries and the
`group` query heads of one kv head (R = QBLK * group score rows) meets the keys KBLK rows at a time,
so each K/V row is read once per tile and stays in L1 while all R rows use it:

- K transposed once per call (kt [KV, hd, T]), then S [R, KBLK] = Q KT over a block by four score
  rows and four hd steps per pass (four key vectors loaded once for sixteen multiply-adds, the rows
  vectorised over keys);
- scale, softcap, ALiBi bias, the visibility mask (k_pos <= q_pos, inside the window), then an
  online softmax per score row (running max, sum and value accumulator, rescaled when a block
  raises the max) with the vectorised `exp_shifted`;
- the accumulator rows += P V over the block, four value rows per pass.

Blocks no query of the tile sees are skipped (causal prompts: about half). Tiles go to numba's
threads in zigzag order (first, last, second, ...) so that static chunks of the range carry equal
causal work. Results agree with the per-query path to float32 rounding (not bit for bit: other
summation order), so elementwise.attention uses this only from TILE_MIN_QUERIES queries on.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from archrun.kernels._jit import JIT, JIT_PAR
from archrun_blocks.decode_attention import exp_shifted
from archrun_blocks.tile_simd import COLS, ROWS, mm4x16, mm4x16_acc

_F32 = np.float32
QBLK = 32   # queries per tile
KBLK = 64   # keys per block
_NEG = _F32(-3.0e38)   # a masked score: below any real one, exp(_NEG - max) flushes to 0
# fewer queries than this keep the per-query path (bit-identical to the decode step's attention)
TILE_MIN_QUERIES = 64


@njit(**JIT)
def _scores_row(q, KT, j0, nb, s):
    """s[:nb] = q . KT[:, j0:j0 + nb] for one score row (the tail of _scores)."""
    hd = q.shape[0]
    for j in range(nb):
        s[j] = _F32(0.0)
    for e in range(hd):
        x, kt = q[e], KT[e, j0:j0 + nb]
        for j in range(nb):
            s[j] += x * kt[j]


@njit(**JIT)
def _scores(Q, KT, j0, nb, S):
    """S[r, :nb] = Q[r] . KT[:, j0:j0 + nb] for every row r: Q [R, hd], KT [hd, T]. Tiles of 4 rows x 16 keys
    in registers (tile_simd) where nb is a multiple of 16 (every block but a prompt's last); else four score
    rows and four hd steps per pass, each loading four KT rows once for sixteen multiply-adds per key."""
    R, hd = Q.shape
    if nb % COLS == 0:
        r = 0
        while r + ROWS <= R:
            for c in range(0, nb, COLS):
                mm4x16(Q[r:r + ROWS], KT[:, j0 + c:j0 + c + COLS], S[r:r + ROWS, c:c + COLS])
            r += ROWS
        for rr in range(r, R):
            _scores_row(Q[rr], KT, j0, nb, S[rr])
        return
    r = 0
    while r + 4 <= R and hd % 4 == 0:
        s0, s1, s2, s3 = S[r], S[r + 1], S[r + 2], S[r + 3]
        q0, q1, q2, q3 = Q[r], Q[r + 1], Q[r + 2], Q[r + 3]
        for j in range(nb):
            s0[j] = s1[j] = s2[j] = s3[j] = _F32(0.0)
        for e in range(0, hd, 4):
            k0, k1, k2, k3 = KT[e, j0:j0 + nb], KT[e + 1, j0:j0 + nb], KT[e + 2, j0:j0 + nb], KT[e + 3, j0:j0 + nb]
            a0, a1, a2, a3 = q0[e], q0[e + 1], q0[e + 2], q0[e + 3]
            b0, b1, b2, b3 = q1[e], q1[e + 1], q1[e + 2], q1[e + 3]
            c0, c1, c2, c3 = q2[e], q2[e + 1], q2[e + 2], q2[e + 3]
            d0, d1, d2, d3 = q3[e], q3[e + 1], q3[e + 2], q3[e + 3]
            for j in range(nb):
                x0, x1, x2, x3 = k0[j], k1[j], k2[j], k3[j]
                s0[j] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                s1[j] += b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3
                s2[j] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
                s3[j] += d0 * x0 + d1 * x1 + d2 * x2 + d3 * x3
        r += 4
    for rr in range(r, R):
        _scores_row(Q[rr], KT, j0, nb, S[rr])


@njit(**JIT)
def _shape_scores(S, nb, rows_q, group, h0, q_pos, k_pos, j0, scale, window, softcap, slopes, full):
    """Scale, cap, bias and mask the scores S [R, :nb] of key rows j0.. (score row r: query
    rows_q[r // group], head h0 + r % group). full: every key of the block is visible to every query."""
    for r in range(S.shape[0]):
        s = S[r]
        for j in range(nb):
            s[j] *= scale
        if softcap > 0:
            for j in range(nb):
                s[j] = softcap * np.tanh(s[j] / softcap)
        qp = q_pos[rows_q[r // group]]
        if slopes.shape[0]:
            m = _F32(slopes[h0 + r % group])
            for j in range(nb):
                s[j] += m * _F32(k_pos[j0 + j] - qp)
        if not full:
            lo = qp - window
            for j in range(nb):
                kp = k_pos[j0 + j]
                if kp > qp or (window > 0 and kp <= lo):
                    s[j] = _NEG


@njit(**JIT)
def _softmax_block(S, nb, mx, tot, acc, bits, seen):
    """Online softmax step: S[r, :nb] becomes exp(S - running max) (0 where masked), the running max,
    sum and accumulator of every score row are updated (rescaled when this block raises the max)."""
    for r in range(S.shape[0]):
        s = S[r][:nb]
        m = s[0]
        for j in range(1, nb):
            m = max(m, s[j])
        if m <= _NEG:          # this row sees nothing in the block
            for j in range(nb):
                s[j] = _F32(0.0)
            continue
        if not seen[r]:
            mx[r] = m
            seen[r] = True
        elif m > mx[r]:
            f = _F32(math.exp(mx[r] - m))
            tot[r] *= f
            a = acc[r]
            for e in range(a.shape[0]):
                a[e] *= f
            mx[r] = m
        tot[r] += exp_shifted(s, mx[r], bits[:nb])


@njit(**JIT)
def _mix_row(p, V, kv, j0, nb, a):
    """a += sum_j p[j] * V[j0 + j, kv] for one accumulator row (the tail of _mix)."""
    for j in range(nb):
        w, vj = p[j], V[j0 + j, kv]
        for e in range(a.shape[0]):
            a[e] += w * vj[e]


@njit(**JIT)
def _mix(P, V, kv, j0, nb, acc):
    """acc[r] += sum_j P[r, j] * V[j0 + j, kv]. Tiles of 4 rows x 16 value columns in registers (tile_simd)
    where vd is a multiple of 16; else four accumulator rows and four value rows per pass, each loading four
    value vectors once for sixteen multiply-adds."""
    R, vd = acc.shape
    if vd % COLS == 0:
        r = 0
        while r + ROWS <= R:
            for e in range(0, vd, COLS):
                mm4x16_acc(P[r:r + ROWS, :nb], V[j0:j0 + nb, kv, e:e + COLS], acc[r:r + ROWS, e:e + COLS])
            r += ROWS
        for rr in range(r, R):
            _mix_row(P[rr], V, kv, j0, nb, acc[rr])
        return
    r = 0
    while r + 4 <= R:
        p0, p1, p2, p3 = P[r], P[r + 1], P[r + 2], P[r + 3]
        a0, a1, a2, a3 = acc[r], acc[r + 1], acc[r + 2], acc[r + 3]
        j = 0
        while j + 4 <= nb:
            v0, v1, v2, v3 = V[j0 + j, kv], V[j0 + j + 1, kv], V[j0 + j + 2, kv], V[j0 + j + 3, kv]
            w00, w01, w02, w03 = p0[j], p0[j + 1], p0[j + 2], p0[j + 3]
            w10, w11, w12, w13 = p1[j], p1[j + 1], p1[j + 2], p1[j + 3]
            w20, w21, w22, w23 = p2[j], p2[j + 1], p2[j + 2], p2[j + 3]
            w30, w31, w32, w33 = p3[j], p3[j + 1], p3[j + 2], p3[j + 3]
            for e in range(a0.shape[0]):
                x0, x1, x2, x3 = v0[e], v1[e], v2[e], v3[e]
                a0[e] += w00 * x0 + w01 * x1 + w02 * x2 + w03 * x3
                a1[e] += w10 * x0 + w11 * x1 + w12 * x2 + w13 * x3
                a2[e] += w20 * x0 + w21 * x1 + w22 * x2 + w23 * x3
                a3[e] += w30 * x0 + w31 * x1 + w32 * x2 + w33 * x3
            j += 4
        for jj in range(j, nb):
            for t in range(4):
                w, vj, a = P[r + t, jj], V[j0 + jj, kv], acc[r + t]
                for e in range(a.shape[0]):
                    a[e] += w * vj[e]
        r += 4
    for rr in range(r, R):
        _mix_row(P[rr], V, kv, j0, nb, acc[rr])


@njit(**JIT)
def _tile(q, kt, v, q_pos, k_pos, kbmin, kbmax, kv, i0, scale, window, softcap, slopes, out):
    """Queries i0 .. i0 + QBLK (fewer at the end) x the query heads of kv head kv, over all keys
    (kt [KV, hd, T]: the keys transposed)."""
    n, n_head, hd = q.shape
    n_kv, n_keys, vd = kt.shape[0], kt.shape[2], v.shape[2]
    group = n_head // n_kv
    h0 = kv * group
    nq = min(QBLK, n - i0)
    R = nq * group
    rows_q = np.arange(i0, i0 + nq)
    Q = np.empty((R, hd), _F32)
    for r in range(R):
        Q[r] = q[i0 + r // group, h0 + r % group]
    qmin, qmax = q_pos[i0], q_pos[i0]
    for i in range(i0, i0 + nq):
        qmin, qmax = min(qmin, q_pos[i]), max(qmax, q_pos[i])
    S = np.empty((R, KBLK), _F32)
    bits = np.empty(KBLK, np.int32)
    mx = np.empty(R, _F32)
    tot = np.zeros(R, _F32)
    acc = np.zeros((R, vd), _F32)
    seen = np.zeros(R, np.bool_)
    for b in range(kbmin.shape[0]):
        if kbmin[b] > qmax or (window > 0 and kbmax[b] <= qmin - window):
            continue  # no query of the tile sees a key of this block
        full = kbmax[b] <= qmin and (window == 0 or kbmin[b] > qmax - window)
        j0 = b * KBLK
        nb = min(KBLK, n_keys - j0)
        _scores(Q, kt[kv], j0, nb, S)
        _shape_scores(S, nb, rows_q, group, h0, q_pos, k_pos, j0, _F32(scale), window, _F32(softcap), slopes,
                      full)
        _softmax_block(S, nb, mx, tot, acc, bits, seen)
        _mix(S, v, kv, j0, nb, acc)
    for r in range(R):
        inv = _F32(1.0) / tot[r]
        o = out[i0 + r // group, h0 + r % group]
        for e in range(vd):
            o[e] = acc[r, e] * inv


@njit(**JIT)
def _block_bounds(k_pos):
    """(min, max) of k_pos over each block of KBLK keys."""
    nblk = (k_pos.shape[0] + KBLK - 1) // KBLK
    lo = np.empty(nblk, np.int64)
    hi = np.empty(nblk, np.int64)
    for b in range(nblk):
        seg = k_pos[b * KBLK:min((b + 1) * KBLK, k_pos.shape[0])]
        lo[b], hi[b] = seg.min(), seg.max()
    return lo, hi


@njit(**JIT)
def _transposed(k):
    """k [T, KV, hd] as kt [KV, hd, T]: each key block's hd rows are then contiguous runs of keys."""
    n_t, n_kv, hd = k.shape
    kt = np.empty((n_kv, hd, n_t), _F32)
    for j in range(n_t):
        for h in range(n_kv):
            for e in range(hd):
                kt[h, e, j] = k[j, h, e]
    return kt


@njit(**JIT)
def _task(t, n_tiles, n_kv):
    """Tile t of the zigzag order: (query tile, kv head); tiles 0, last, 1, last - 1, ... so that each
    thread's static share of the range holds as much causal work as the others'."""
    u = t // n_kv
    qt = u // 2 if u % 2 == 0 else n_tiles - 1 - u // 2
    return qt, t % n_kv


@njit(**JIT_PAR)
def attend_tiled(q, k, v, q_pos, k_pos, scale, window, softcap, slopes, out):
    """Causal grouped-query attention of q [n, H, hd] over k [T, KV, hd], v [T, KV, vd] -> out [n, H, vd]
    (the contract of elementwise.attention; inputs validated there), in tiles on numba's threads."""
    n, n_kv = q.shape[0], k.shape[1]
    kbmin, kbmax = _block_bounds(k_pos)
    kt = _transposed(k)
    n_tiles = (n + QBLK - 1) // QBLK
    for t in prange(n_tiles * n_kv):
        qt, kv = _task(t, n_tiles, n_kv)
        _tile(q, kt, v, q_pos, k_pos, kbmin, kbmax, kv, qt * QBLK, scale, window, softcap, slopes, out)
