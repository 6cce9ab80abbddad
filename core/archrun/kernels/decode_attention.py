"""Attention of one decode token over the cached rows of a layer (used inside kernels.block)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT

_F32 = np.float32


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
def attend_one(q, kc, vc, rows, count, n_head, scale, out):
    """Grouped-query attention of one token: q [H * hd], cache kc [cap, KV, hd], vc [cap, KV, vd] -> out [H * vd]."""
    n_kv, hd = kc.shape[1], kc.shape[2]
    vd = vc.shape[2]
    group = n_head // n_kv
    p = np.empty(count, np.float32)
    for h in range(n_head):
        kv = h // group
        qh = q[h * hd:(h + 1) * hd]
        m = -np.inf
        for j in range(count):
            kj = kc[rows[j], kv]
            s = _F32(0.0)
            for e in range(hd):
                s += qh[e] * kj[e]
            s *= scale
            p[j] = s
            m = max(m, s)
        tot = _F32(0.0)
        for j in range(count):
            e_ = _F32(math.exp(p[j] - m))
            p[j] = e_
            tot += e_
        o = out[h * vd:(h + 1) * vd]
        o[:] = 0
        inv = _F32(1.0) / tot
        for j in range(count):
            vj = vc[rows[j], kv]
            wj = p[j] * inv
            for e in range(vd):
                o[e] += wj * vj[e]
