"""attention="deepseek4"'s fast kernels (the math and its reference: archrun_deepseek4_ops.attention).

Each kernel computes one output row (a token, a compressed window) from that row's own inputs in a fixed
order, looping over exactly the keys, slots and dims the row reads: a row's bits do not depend on which
other rows share its call (a token decoded alone, in a span or in a batch). Under the kernels' float flags
(no infinities: archrun.kernels._jit) masked keys and empty slots are skipped, never set to -inf.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from archrun.kernels._jit import JIT, JIT_PAR

_F32 = np.float32


@njit(**dict(JIT, inline="always"))
def _dot(a, b, n):
    """sum of a[i] b[i] over i < n in float32, in a stated order: element i goes to lane i % 8, the lanes
    summed as ((0+1)+(2+3))+((4+5)+(6+7)), then the tail in element order (eight chains LLVM vectorises
    without reassociating)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _F32(0.0)
    end = n - n % 8
    for i in range(0, end, 8):
        a0 += a[i] * b[i]
        a1 += a[i + 1] * b[i + 1]
        a2 += a[i + 2] * b[i + 2]
        a3 += a[i + 3] * b[i + 3]
        a4 += a[i + 4] * b[i + 4]
        a5 += a[i + 5] * b[i + 5]
        a6 += a[i + 6] * b[i + 6]
        a7 += a[i + 7] * b[i + 7]
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for i in range(end, n):
        s += a[i] * b[i]
    return s


@njit(**JIT)
def rope_rows(x, pos, inv, sign, out):
    """out [n, k, hd]: x [n, k, hd] with its trailing 2 len(inv) dims rotated pairwise (2i, 2i + 1) by
    sign * pos[row] * inv[i] (angles in float64, cos/sin rounded to float32)."""
    n, k, hd = x.shape
    half = inv.shape[0]
    off = hd - 2 * half
    for a in range(n):
        for j in range(k):
            for d in range(off):
                out[a, j, d] = x[a, j, d]
        for i in range(half):
            ang = np.float64(pos[a]) * inv[i]
            c = _F32(math.cos(ang))
            s = _F32(sign * math.sin(ang))
            for j in range(k):
                e, o = x[a, j, off + 2 * i], x[a, j, off + 2 * i + 1]
                out[a, j, off + 2 * i] = e * c - o * s
                out[a, j, off + 2 * i + 1] = o * c + e * s


@njit(**JIT)
def pool_windows(kv, gate, first_slot, norm, eps, inv, first, out):
    """out [W, c]: window w's entry from its slots kv, gate [W, S, c] (gate with its position bias), the
    slots before first_slot[w] empty: softmax over the slots per channel, weighted sum, unweighted rms
    times norm [c], rope on the trailing dims at position first[w]."""
    n_win, n_slot, width = kv.shape
    half = inv.shape[0]
    off = width - 2 * half
    pooled = np.empty(width, _F32)
    for w in range(n_win):
        lo = first_slot[w]
        for c in range(width):
            top = gate[w, lo, c]
            for s in range(lo + 1, n_slot):
                top = max(top, gate[w, s, c])
            total = _F32(0.0)
            for s in range(lo, n_slot):
                total += _F32(math.exp(gate[w, s, c] - top))
            acc = _F32(0.0)
            for s in range(lo, n_slot):
                acc += kv[w, s, c] * (_F32(math.exp(gate[w, s, c] - top)) / total)
            pooled[c] = acc
        ms = _F32(0.0)
        for c in range(width):
            ms += pooled[c] * pooled[c]
        r = _F32(math.sqrt(ms / _F32(width) + eps))
        for c in range(width):
            pooled[c] = pooled[c] / r * norm[c]
        for c in range(off):
            out[w, c] = pooled[c]
        for i in range(half):
            ang = np.float64(first[w]) * inv[i]
            cs, sn = _F32(math.cos(ang)), _F32(math.sin(ang))
            e, o = pooled[off + 2 * i], pooled[off + 2 * i + 1]
            out[w, off + 2 * i] = e * cs - o * sn
            out[w, off + 2 * i + 1] = o * cs + e * sn


@njit(**JIT_PAR)
def index_scores_rows(q, w, keys, n_vis, scale, out):
    """out [n, T]: for row a and entry t < n_vis[a], sum_h w[a, h] relu(q[a, h] . keys[t] scale) (HF's
    order; the dots by `_dot`, the heads in order); entries past n_vis[a] are left as they are (the caller
    masks them). Rows run in parallel, each on its own inputs."""
    n, n_head, width = q.shape
    for a in prange(n):
        for t in range(n_vis[a]):
            acc = _F32(0.0)
            for h in range(n_head):
                acc += max(_dot(q[a, h], keys[t], width) * scale, _F32(0.0)) * w[a, h]
            out[a, t] = acc


@njit(**JIT)
def _key(rows, entries, sel, use_sel, a, k, n_rows, first_row):
    """Key k of row a: the window's rows first (from rows[first_row]), then its entries."""
    if k < n_rows:
        return rows[first_row + k]
    return entries[sel[a, k - n_rows] if use_sel else k - n_rows]


@njit(**JIT_PAR)
def attend_rows(q, rows, base, pos, window, entries, sel, n_sel, sinks, scale, out):
    """out [n, H, hd]: query row a (position pos[a]) of q [n, H, hd] over the K=V rows of positions
    max(base, pos[a] - window + 1) .. pos[a] (rows [T, hd] hold positions base..) and the entries
    sel[a, :n_sel[a]] of entries [E, hd] (sel empty: entries 0 .. n_sel[a] - 1), softmax with the head's
    sink logit, in key order (scores by `_dot`). Rows run in parallel, each on its own inputs."""
    n, n_head, hd = q.shape
    use_sel = sel.shape[1] > 0
    n_max = window + (sel.shape[1] if use_sel else entries.shape[0])
    for a in prange(n):
        scores = np.empty(n_max, _F32)
        p = pos[a]
        lo = max(base, p - window + 1)
        n_rows = p - lo + 1
        n_keys = n_rows + n_sel[a]
        for h in range(n_head):
            top = sinks[h]
            for k in range(n_keys):
                key = _key(rows, entries, sel, use_sel, a, k, n_rows, lo - base)
                scores[k] = _dot(q[a, h], key, hd) * scale
                top = max(top, scores[k])
            total = _F32(0.0)
            for k in range(n_keys):
                scores[k] = _F32(math.exp(scores[k] - top))
                total += scores[k]
            total += _F32(math.exp(sinks[h] - top))
            for d in range(hd):
                out[a, h, d] = _F32(0.0)
            for k in range(n_keys):
                key = _key(rows, entries, sel, use_sel, a, k, n_rows, lo - base)
                wgt = scores[k] / total
                for d in range(hd):
                    out[a, h, d] += wgt * key[d]
