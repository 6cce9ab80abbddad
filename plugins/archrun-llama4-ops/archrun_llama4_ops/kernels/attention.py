"""Attention "llama4" for one token: the fused decode path's kernel part, and the query/key preparation the
op-by-op path runs over rows (archrun_llama4_ops.fast), so both compute it with the same code.

Parameters p (float64): scale, chunk (0: a global layer), softcap, eps, qk_norm (0/1).

- chunked layers (chunk W > 0): q and k (after rope) are L2-normalised per head when qk_norm,
  x * (1 / sqrt(sum(x^2) / hd + eps)) with the sum of squares in float64 in element order; the query
  at `pos` sees the cached rows of positions pos // W * W .. pos (its chunk);
- global layers (W = 0): q is scaled by the temperature tuning 1 + 0.1 log(floor((pos + 1) / 8192) + 1)
  (float64, rounded to float32), then sees every row up to pos.

Then the token's K/V go to the cache row (a ring also records the row's position) and archrun-blocks'
one-token attention runs over the visible rows: `attend_one` up to SPLIT_MIN_ROWS rows, else
`attend_split` (chunks of keys shared with the decode pool as its task decode_attention.attend_chunk),
exactly as archrun-blocks' causal part does. The parts over float16 and q8_0 caches (the same code compiled
for their cache dtypes) are in kernels.kv_attention, imported on the first such cache.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES
from archrun_blocks.decode_attention import SPLIT_MIN_ROWS, attend_one, attend_split, visible_rows
from archrun_blocks.kv_codec import store_row

_F32 = np.float32
_STEP = dict(JIT, inline="always")
P_SCALE, P_CHUNK, P_SOFTCAP, P_EPS, P_QK_NORM = range(5)
TEMP_SCALE, TEMP_FLOOR = 0.1, 8192.0  # llama.cpp's f_attn_temp_scale, n_attn_temp_floor_scale for llama4


@njit(**_STEP)
def _l2_heads(v, n_head, hd, eps):
    """Each head of v [n_head * hd] in place: x * (1 / sqrt(sum(x^2) / hd + eps)), sum in float64."""
    for h in range(n_head):
        seg = v[h * hd:(h + 1) * hd]
        ss = 0.0
        for i in range(hd):
            x = np.float64(seg[i])
            ss += x * x
        r = _F32(1.0 / math.sqrt(ss / hd + eps))
        for i in range(hd):
            seg[i] = seg[i] * r


@njit(**_STEP)
def temperature(pos):
    """The global layers' query scale at position pos (float32)."""
    return _F32(1.0 + TEMP_SCALE * math.log(math.floor((pos + 1.0) / TEMP_FLOOR) + 1.0))


@njit(**_STEP)
def _prepare(p, q, k, n_head, n_kv, hd, pos):
    """One token's q [n_head * hd] and k [n_kv * hd] in place: L2-normalised (chunked layers with q/k
    norms) or q scaled by the temperature (global layers)."""
    if p[P_CHUNK] > 0:
        if p[P_QK_NORM] != 0:
            _l2_heads(q, n_head, hd, p[P_EPS])
            _l2_heads(k, n_kv, hd, p[P_EPS])
    else:
        t = temperature(pos)
        for i in range(q.shape[0]):
            q[i] = q[i] * t


@njit(**JIT)
def prepare_rows(p, q, k, start):
    """_prepare on every row, in place: q f32 [n, H * hd], k f32 [n, KV, hd] (C-contiguous), row i the token at
    position start + i (the op-by-op path's q/k preparation: the part's own code)."""
    n, n_kv, hd = k.shape
    n_head = q.shape[1] // hd
    for i in range(n):
        _prepare(p, q[i], k[i].reshape(n_kv * hd), n_head, n_kv, hd, start + i)


@njit(**_STEP)
def _llama4(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """The part's body over a cache of any kv type (compiled per cache dtype)."""
    n_kv = kc.shape[1]
    hd, vd = k.shape[0] // n_kv, v.shape[0] // n_kv
    n_head = q.shape[0] // hd
    _prepare(p, q, k, n_head, n_kv, hd, pos)
    for h in range(n_kv):
        store_row(k[h * hd:(h + 1) * hd], kc[row, h])
        store_row(v[h * vd:(h + 1) * vd], vc[row, h])
    if ring:
        kpos[row] = pos
    chunk = np.int64(p[P_CHUNK])
    # the chunk's rows as a window: positions > pos - (pos % W + 1), i.e. >= pos // W * W
    window = pos % chunk + 1 if chunk > 0 else 0
    rows = np.empty(kc.shape[0], np.int64)
    count = visible_rows(kpos, ring, pos, window, rows)
    if count <= SPLIT_MIN_ROWS:
        attend_one(q, kc, vc, rows, count, n_head, p[P_SCALE], p[P_SOFTCAP], out)
    else:  # a long context: chunks of keys, shared with the decode pool when one runs
        attend_split(q, kc, vc, rows, count, n_head, p[P_SCALE], p[P_SOFTCAP], np.empty(0, np.float64),
                     np.empty(0, _F32), out, ctrl, task)


@njit(SIGNATURES["attention"], **JIT)
def llama4_attention(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """Attention "llama4" of one token over a float32 cache (see the module docstring)."""
    _llama4(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)
