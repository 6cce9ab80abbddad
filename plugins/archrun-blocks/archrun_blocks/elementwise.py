"""Op-by-op fast kernels (prefill and the op path): norms, rotary embedding, attention, activations.

Norms, rope and activations run their kernel part (archrun_blocks.parts) over rows, so the
numba math of an op exists once; attention over a few queries runs the decode part's attention
(decode_attention.attend_sinks) for each query over the keys it sees, in parallel over queries,
and over TILE_MIN_QUERIES or more queries tiles of queries x keys (prefill_attention; attention with
sink logits keeps the per-query path).
Each public function validates shapes and dtypes in Python (raising ShapeMismatch), then runs one
jitted kernel that writes into a fresh float32 output.
They match the numpy reference ops (archrun_blocks.reference) to float32 rounding.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange, typed

from archrun.errors import ShapeMismatch
from archrun.kernels._jit import JIT, JIT_PAR
from archrun.kernels.decode.addresses import address, array_at
from archrun.kernels.decode.parts import part
from archrun_blocks import parts
from archrun_blocks.decode_attention import attend_sinks
from archrun_blocks.prefill_attention import TILE_MIN_QUERIES, attend_tiled

_F32 = np.float32
# attention work (n * H * T * head_dim multiply-adds) above which heads go to the thread pool
_ATTN_PARALLEL_WORK = 1 << 18


def _need(cond: bool, what) -> None:
    """Raise ShapeMismatch(what()) unless cond: `what` is a callable, so messages are built only on failure."""
    if not cond:
        raise ShapeMismatch(what())


_F32_DTYPE = np.dtype(np.float32)
_NONE = np.empty(0, np.float32)
_NO_SINKS = np.empty(0, np.float64)
_ROPE = part(parts.rope)  # the rope part (its parameters vary per call)


def _part_handle(fn) -> None:
    # a bare numba function would make the kernel compile (and cache) a version for that very
    # function, in every process, and a (fn,) tuple costs ~0.1 ms a call to convert: kernels take
    # a part's handle (Part.handle, a typed list built once)
    if not (isinstance(fn, typed.List) or (numba.config.DISABLE_JIT and isinstance(fn, list))):
        raise TypeError(f"expected a kernel part's handle (archrun.kernels.decode.parts.Part.handle), got {fn!r}")


def _f32(a, name: str, ndim: int) -> None:
    # hot path (every op of every token): compare first, format the message only on failure
    if isinstance(a, np.ndarray) and a.dtype is _F32_DTYPE and a.ndim == ndim:
        return
    if isinstance(a, np.ndarray) and a.dtype == _F32_DTYPE and a.ndim == ndim:
        return
    raise ShapeMismatch(f"{name} must be a float32 array with {ndim} dims, got "
                        f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")


# -- norms, rope, activations: parts over rows -----------------------------------------------------


@njit(**JIT)
def _norm_rows(fn, p, x, w, b, out):
    for t in range(x.shape[0]):
        fn[0][0](p, x[t], w, b, out[t])


def norm_rows(fn, params: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The norm part fn over the rows of x[n, d] with weight w[d] (and bias b[d]) -> float32 [n, d].

    fn is the part's handle (archrun.kernels.decode.parts.Part.handle)."""
    _part_handle(fn)
    _f32(x, "x", 2)
    _f32(w, "w", 1)
    _need(w.shape[0] == x.shape[1], lambda: f"norm weight {w.shape} does not match x {x.shape}")
    b = _NONE if b is None else b
    _f32(b, "b", 1)
    _need(b.shape[0] in (0, x.shape[1]), lambda: f"norm bias {b.shape} does not match x {x.shape}")
    out = np.empty(x.shape, np.float32)
    _norm_rows(fn, params, np.ascontiguousarray(x), np.ascontiguousarray(w), np.ascontiguousarray(b), out)
    return out


@njit(**JIT)
def _rope_rows(fn, p, x, cos, sin, out):
    n, n_head, hd = x.shape
    out[:] = x
    for t in range(n):
        fn[0][0](p, out[t].reshape(n_head * hd), n_head, hd, cos[t], sin[t])


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """Rotate the first n_rot dims of every head: x[n, H, hd], cos/sin [n, n_rot/2] -> [n, H, hd].

    neox pairs dims (i, i + n_rot/2), otherwise (2i, 2i+1); dims >= n_rot pass through.
    """
    _f32(x, "x", 3)
    _f32(cos, "cos", 2)
    _f32(sin, "sin", 2)
    n, _, hd = x.shape
    _need(isinstance(n_rot, (int, np.integer)) and 0 < n_rot <= hd and n_rot % 2 == 0,
          lambda: f"n_rot={n_rot!r} must be even and in 1..{hd}")
    _need(cos.shape == (n, n_rot // 2) and sin.shape == cos.shape,
          lambda: f"cos/sin {cos.shape}/{sin.shape} must be [{n}, {n_rot // 2}]")
    out = np.empty(x.shape, np.float32)
    params = np.array([n_rot, 1.0 if neox else 0.0])
    _rope_rows(_ROPE.handle, params, np.ascontiguousarray(x), np.ascontiguousarray(cos), np.ascontiguousarray(sin),
               out)
    return out


@njit(**JIT)
def _act_rows(fn, p, gate, up, out):
    """out[i] = fn(gate[i]) (* up[i] when up has rows) one row at a time: gate, up float32 [n, m] with
    contiguous rows at any row stride (column slices of one fused gate/up product, read in place), out C
    [n, m]. A row at a time keeps the part's scratch (a few floats per element) in the core's cache: over
    a whole 512 x 4864 prompt chunk it was 5 arrays of 10 MB a layer, memory-bound."""
    n, m = out.shape
    for i in range(n):
        o = out[i]
        fn[0][0](p, array_at(address(gate) + i * gate.strides[0], (m,), np.float32), o)
        if up.shape[0]:
            u = array_at(address(up) + i * up.strides[0], (m,), np.float32)
            for j in range(m):
                o[j] *= u[j]


def _rows(a: np.ndarray) -> np.ndarray:
    """a as float32 [n, m] with contiguous rows: itself when it is one already (a column slice of a
    fused product), else a contiguous copy with a's last axis as rows."""
    if a.ndim == 2 and a.strides[1] == 4 and a.strides[0] >= 0 and a.shape[1] > 0:
        return a
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1] if a.ndim else 1)


def activation(fn, params: np.ndarray, gate: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
    """The activation part fn (its handle, Part.handle) of gate (any shape, float32), times up (same
    shape) when given."""
    _part_handle(fn)
    _f32(gate, "gate", gate.ndim if isinstance(gate, np.ndarray) else 2)
    if up is not None:
        _need(isinstance(up, np.ndarray) and up.dtype == np.float32 and up.shape == gate.shape,
              lambda: f"up {getattr(up, 'shape', None)} must be float32 shaped like gate {gate.shape}")
    out = np.empty(gate.shape, np.float32)
    if out.size == 0:
        return out
    rows = _rows(gate)
    _act_rows(fn, params, rows, _NONE.reshape(0, 1) if up is None else _rows(up), out.reshape(rows.shape))
    return out


@njit(**JIT)
def _gated_rows(fn, p, gate, up, out):
    """out[i] = fn(gate[i], up[i]) one row at a time (a gated part, SIGNATURES["gated"]): rows as _act_rows."""
    n, m = out.shape
    for i in range(n):
        fn[0][0](p, array_at(address(gate) + i * gate.strides[0], (m,), np.float32),
                 array_at(address(up) + i * up.strides[0], (m,), np.float32), out[i])


def gated_activation(fn, params: np.ndarray, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The gated activation part fn (its handle, Part.handle; fn(p, gate, up, out)) of gate and up (float32,
    one shape)."""
    _part_handle(fn)
    _f32(gate, "gate", gate.ndim if isinstance(gate, np.ndarray) else 2)
    _need(isinstance(up, np.ndarray) and up.dtype == np.float32 and up.shape == gate.shape,
          lambda: f"up {getattr(up, 'shape', None)} must be float32 shaped like gate {gate.shape}")
    out = np.empty(gate.shape, np.float32)
    if out.size == 0:
        return out
    rows = _rows(gate)
    _gated_rows(fn, params, rows, _rows(up), out.reshape(rows.shape))
    return out


# -- attention ---------------------------------------------------------------------------------


@njit(**dict(JIT, inline="always"))
def _attend_query(q, k, v, q_pos, k_pos, scale, window, softcap, slopes, sinks, i, out):
    """Query i: its visible keys listed, then decode_attention.attend_sinks (the fused decode part's
    attention; sinks empty: attend_biased) over them: q [n, H, hd], k [T, KV, hd], v [T, KV, vd] -> out[i]
    [H, vd]."""
    n_head = q.shape[1]
    rows = np.empty(k.shape[0], np.int64)
    count = 0
    lo = q_pos[i] - window
    for j in range(k.shape[0]):
        if k_pos[j] <= q_pos[i] and (window == 0 or k_pos[j] > lo):
            rows[count] = j
            count += 1
    dist = np.empty(count if slopes.shape[0] else 0, _F32)
    for c in range(dist.shape[0]):
        dist[c] = _F32(k_pos[rows[c]] - q_pos[i])
    attend_sinks(q[i].reshape(n_head * q.shape[2]), k, v, rows, count, n_head, scale, softcap, slopes, dist, sinks,
                 out[i].reshape(n_head * v.shape[2]))


@njit(**JIT)
def _attend(q, k, v, q_pos, k_pos, scale, window, softcap, slopes, sinks, out):
    for i in range(q.shape[0]):
        _attend_query(q, k, v, q_pos, k_pos, scale, window, softcap, slopes, sinks, i, out)


@njit(**JIT_PAR)
def _attend_par(q, k, v, q_pos, k_pos, scale, window, softcap, slopes, sinks, out):
    for i in prange(q.shape[0]):
        _attend_query(q, k, v, q_pos, k_pos, scale, window, softcap, slopes, sinks, i, out)


def _check_attention(q, k, v, q_pos, k_pos, window) -> None:
    for a, name in ((q, "q"), (k, "k"), (v, "v")):
        _f32(a, name, 3)
    n, n_head, hd = q.shape
    n_t, n_kv, _ = k.shape
    _need(k.shape[2] == hd, lambda: f"k head_dim {k.shape[2]} != q head_dim {hd}")
    _need(v.shape[:2] == (n_t, n_kv), lambda: f"v {v.shape} does not match k {k.shape}")
    _need(n_kv > 0 and n_head % n_kv == 0, lambda: f"{n_head} query heads do not group over {n_kv} kv heads")
    for p, m, name in ((q_pos, n, "q_pos"), (k_pos, n_t, "k_pos")):
        _need(isinstance(p, np.ndarray) and p.dtype == np.int64 and p.shape == (m,),
              lambda name=name, m=m: f"{name} must be int64 [{m}]")
    _need(isinstance(window, (int, np.integer)) and window >= 0, lambda: f"window={window!r} must be >= 0")


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
              scale: float, window: int, softcap: float = 0.0, slopes: np.ndarray | None = None,
              sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal grouped-query attention: q[n, H, hd], k[T, KV, hd], v[T, KV, vd] -> [n, H, vd].

    Key j is visible to query i iff k_pos[j] <= q_pos[i] and (window == 0 or
    k_pos[j] > q_pos[i] - window); head h reads kv head h // (H // KV). Softmax in float32
    with max subtraction, scores capped to softcap * tanh(s / softcap) when softcap > 0, then
    (ALiBi, when slopes float32 [H] are given) biased by slopes[h] * (k_pos[j] - q_pos[i]); with
    sinks float32 [H], head h's softmax also counts the logit sinks[h] (decode_attention.attend_sinks:
    every query by the decode step's attention). Every query must see at least one key.
    """
    _check_attention(q, k, v, q_pos, k_pos, window)
    n, n_head, _ = q.shape
    if slopes is None:
        slopes = _NONE
    else:
        _f32(slopes, "slopes", 1)
        _need(slopes.shape[0] == n_head, lambda: f"slopes {slopes.shape} must be [{n_head}]")
    if sinks is not None:
        _f32(sinks, "sinks", 1)
        _need(sinks.shape[0] == n_head, lambda: f"sinks {sinks.shape} must be [{n_head}]")
    out = np.empty((n, n_head, v.shape[2]), np.float32)
    if n == 0:
        return out
    args = (np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
            q_pos, k_pos, float(scale), int(window), float(softcap), np.ascontiguousarray(slopes, np.float64))
    if n >= TILE_MIN_QUERIES and sinks is None:  # long prompts: tiles of queries x keys (prefill_attention)
        attend_tiled(*args, out)
        return out
    work = n * n_head * k.shape[0] * q.shape[2]
    (_attend_par if work >= _ATTN_PARALLEL_WORK else _attend)(
        *args, _NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float64), out)
    return out
