"""Fast elementwise ops: RMSNorm, rotary embedding, causal GQA attention, gated activations.

Each public function validates shapes and dtypes in Python (raising ShapeMismatch), then
runs one jitted kernel that writes into a fresh float32 output. They match the numpy
reference ops of the core vocabulary (archrun_blocks.reference) to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from archrun.errors import ShapeMismatch
from archrun.kernels._jit import JIT, JIT_PAR

_F32 = np.float32
# attention work (n * H * T * head_dim multiply-adds) above which heads go to the thread pool
_ATTN_PARALLEL_WORK = 1 << 18


def _need(cond: bool, what) -> None:
    """Raise ShapeMismatch(what()) unless cond: `what` is a callable, so messages are built only on failure."""
    if not cond:
        raise ShapeMismatch(what())


_F32_DTYPE = np.dtype(np.float32)


def _f32(a, name: str, ndim: int) -> None:
    # hot path (every op of every token): compare first, format the message only on failure
    if isinstance(a, np.ndarray) and a.dtype is _F32_DTYPE and a.ndim == ndim:
        return
    if isinstance(a, np.ndarray) and a.dtype == _F32_DTYPE and a.ndim == ndim:
        return
    raise ShapeMismatch(f"{name} must be a float32 array with {ndim} dims, got "
                        f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")


# -- RMSNorm -----------------------------------------------------------------------------------


@njit(**JIT)
def _rms_norm(x, w, eps, out):
    n, d = x.shape
    for t in range(n):
        row = x[t]
        ss = 0.0  # float64 sum of squares
        for i in range(d):
            ss += np.float64(row[i]) * row[i]
        r = _F32(1.0 / math.sqrt(ss / d + eps))
        o = out[t]
        for i in range(d):
            o[i] = row[i] * r * w[i]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x[n, d] / sqrt(mean(x^2) + eps) * w[d] -> float32 [n, d]."""
    _f32(x, "x", 2)
    _f32(w, "w", 1)
    _need(w.shape[0] == x.shape[1], lambda: f"norm weight {w.shape} does not match x {x.shape}")
    out = np.empty(x.shape, np.float32)
    _rms_norm(np.ascontiguousarray(x), np.ascontiguousarray(w), float(eps), out)
    return out


# -- rotary embedding --------------------------------------------------------------------------


@njit(**dict(JIT, inline="always"))
def rotate_pairs(xi, o, n_rot, neox, c, s):
    """o[ia], o[ib] = rotation of (xi[ia], xi[ib]) by angle i (cos c[i], sin s[i]) for i < n_rot/2:
    NEOX pairs (i, i + n_rot/2), NORM pairs (2i, 2i + 1). o may be xi (each pair is read first)."""
    half = n_rot // 2
    for i in range(half):
        ia = i if neox else 2 * i
        ib = i + half if neox else 2 * i + 1
        a = xi[ia]
        b = xi[ib]
        o[ia] = a * c[i] - b * s[i]
        o[ib] = b * c[i] + a * s[i]


@njit(**JIT)
def _rope(x, cos, sin, n_rot, neox, out):
    n, n_head, hd = x.shape
    for t in range(n):
        c = cos[t]
        s = sin[t]
        for h in range(n_head):
            xi = x[t, h]
            o = out[t, h]
            for i in range(n_rot, hd):
                o[i] = xi[i]
            rotate_pairs(xi, o, n_rot, neox, c, s)


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
    _rope(np.ascontiguousarray(x), np.ascontiguousarray(cos), np.ascontiguousarray(sin),
          int(n_rot), bool(neox), out)
    return out


# -- attention ---------------------------------------------------------------------------------


@njit(**JIT)
def _attend_one(q, k, v, q_pos, k_pos, scale, window, item, group, out):
    """One (query i, kv head) item: the `group` query heads sharing that kv head."""
    n_kv = k.shape[1]
    i = item // n_kv
    kv = item % n_kv
    n_t, hd = k.shape[0], k.shape[2]
    vd = v.shape[2]
    p = np.empty((group, n_t), np.float32)
    lo = q_pos[i] - window
    for j in range(n_t):
        visible = k_pos[j] <= q_pos[i] and (window == 0 or k_pos[j] > lo)
        kj = k[j, kv]
        for g in range(group):
            if visible:
                qg = q[i, kv * group + g]
                s = _F32(0.0)
                for e in range(hd):
                    s += qg[e] * kj[e]
                p[g, j] = s * scale
            else:
                p[g, j] = -np.inf
    for g in range(group):
        pg = p[g]
        m = pg.max()
        tot = _F32(0.0)
        for j in range(n_t):
            pg[j] = math.exp(pg[j] - m) if pg[j] != -np.inf else _F32(0.0)
            tot += pg[j]
        o = out[i, kv * group + g]
        o[:] = 0
        for j in range(n_t):
            if pg[j] != 0:
                wj = pg[j] / tot
                vj = v[j, kv]
                for e in range(vd):
                    o[e] += wj * vj[e]


@njit(**JIT)
def _attend(q, k, v, q_pos, k_pos, scale, window, out):
    group = q.shape[1] // k.shape[1]
    for item in range(q.shape[0] * k.shape[1]):
        _attend_one(q, k, v, q_pos, k_pos, scale, window, item, group, out)


@njit(**JIT_PAR)
def _attend_par(q, k, v, q_pos, k_pos, scale, window, out):
    group = q.shape[1] // k.shape[1]
    for item in prange(q.shape[0] * k.shape[1]):
        _attend_one(q, k, v, q_pos, k_pos, scale, window, item, group, out)


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
              scale: float, window: int) -> np.ndarray:
    """Causal grouped-query attention: q[n, H, hd], k[T, KV, hd], v[T, KV, vd] -> [n, H, vd].

    Key j is visible to query i iff k_pos[j] <= q_pos[i] and (window == 0 or
    k_pos[j] > q_pos[i] - window); head h reads kv head h // (H // KV). Softmax in float32
    with max subtraction. Every query must see at least one key.
    """
    _check_attention(q, k, v, q_pos, k_pos, window)
    n, n_head, _ = q.shape
    out = np.empty((n, n_head, v.shape[2]), np.float32)
    if n == 0:
        return out
    args = (np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
            q_pos, k_pos, _F32(scale), int(window), out)
    work = n * n_head * k.shape[0] * q.shape[2]
    (_attend_par if work >= _ATTN_PARALLEL_WORK else _attend)(*args)
    return out


# -- gated activations -------------------------------------------------------------------------


@njit(**JIT)
def _swiglu(gate, up, out):
    for i in range(gate.size):
        g = gate[i]
        out[i] = g / (_F32(1.0) + np.exp(-g)) * up[i]


_GELU_C = _F32(math.sqrt(2.0 / math.pi))


@njit(**JIT)
def _geglu_tanh(gate, up, out):
    for i in range(gate.size):
        g = gate[i]
        out[i] = _F32(0.5) * g * (_F32(1.0) + np.tanh(_GELU_C * (g + _F32(0.044715) * g * g * g))) * up[i]


def _gated(kernel, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    _f32(gate, "gate", gate.ndim if isinstance(gate, np.ndarray) else 2)
    _need(isinstance(up, np.ndarray) and up.dtype == np.float32 and up.shape == gate.shape,
          lambda: f"up {getattr(up, 'shape', None)} must be float32 shaped like gate {gate.shape}")
    out = np.empty(gate.shape, np.float32)
    kernel(np.ascontiguousarray(gate).reshape(-1), np.ascontiguousarray(up).reshape(-1), out.reshape(-1))
    return out


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, elementwise over [n, f] float32."""
    return _gated(_swiglu, gate, up)


def geglu_tanh(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return _gated(_geglu_tanh, gate, up)
