"""Recurrent scans as numba kernels: Mamba2's and Mamba's selective scans, the (gated, per-channel) delta rule."""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT


@njit(**JIT)
def _scan(state, x, dt, a, b, c, y):  # pragma: no cover - compiled
    """state [H, P, N] in place; x/y [n, H, P], dt [n, H], a [H], b/c [n, H, N]."""
    n, heads, width = x.shape
    dims = state.shape[2]
    for t in range(n):
        for h in range(heads):
            decay = np.float32(np.exp(dt[t, h] * a[h]))
            for p in range(width):
                u = dt[t, h] * x[t, h, p]
                acc = np.float32(0.0)
                for s in range(dims):
                    v = state[h, p, s] * decay + u * b[t, h, s]
                    state[h, p, s] = v
                    acc += v * c[t, h, s]
                y[t, h, p] = acc


def selective_scan(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                   c: np.ndarray) -> np.ndarray:
    """The selective scan (state updated in place) -> y [n, H, P]; shapes checked before the kernel."""
    n, heads, width = x.shape
    dims = state.shape[2]
    if state.shape != (heads, width, dims) or dt.shape != (n, heads) or a.shape != (heads,) \
            or b.shape != (n, heads, dims) or c.shape != (n, heads, dims) or state.dtype != np.float32:
        raise ValueError(f"selective_scan: state {state.shape}, x {x.shape}, dt {dt.shape}, a {a.shape}, "
                         f"b {b.shape}, c {c.shape} do not agree")
    y = np.empty((n, heads, width), np.float32)
    f32 = [np.ascontiguousarray(v, np.float32) for v in (x, dt, a, b, c)]
    _scan(state, *f32, y)
    return y


@njit(**JIT)
def _delta(state, q, k, v, g, beta, o):  # pragma: no cover - compiled
    """state [H, dk, dv] in place; q/k/g [n, H, dk] (g: the log decay of each key channel), v/o [n, H, dv],
    beta [n, H]."""
    n, heads, dk = q.shape
    dv = v.shape[2]
    kv = np.empty(dv, np.float32)
    for t in range(n):
        for h in range(heads):
            kv[:] = 0.0
            for i in range(dk):
                decay = np.float32(np.exp(g[t, h, i]))
                for j in range(dv):
                    state[h, i, j] *= decay
                    kv[j] += state[h, i, j] * k[t, h, i]
            for j in range(dv):
                kv[j] = (v[t, h, j] - kv[j]) * beta[t, h]           # the delta
            for j in range(dv):
                o[t, h, j] = 0.0
            for i in range(dk):
                for j in range(dv):
                    state[h, i, j] += k[t, h, i] * kv[j]
                    o[t, h, j] += state[h, i, j] * q[t, h, i]


def delta_rule(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
               beta: np.ndarray) -> np.ndarray:
    """The gated delta rule (state updated in place) -> o [n, H, dv] (archrun_recurrent.deltanet.delta_reference);
    g [n, H] decays a head's state as a whole (gated DeltaNet), g [n, H, dk] each key channel (KDA)."""
    n, heads, dk = q.shape
    dv = v.shape[2]
    if state.shape != (heads, dk, dv) or k.shape != q.shape or v.shape[:2] != (n, heads) \
            or g.shape not in ((n, heads), (n, heads, dk)) or beta.shape != (n, heads) or state.dtype != np.float32:
        raise ValueError(f"delta_rule: state {state.shape}, q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
                         f"beta {beta.shape} do not agree")
    o = np.empty((n, heads, dv), np.float32)
    g = np.broadcast_to(g.reshape(n, heads, -1), (n, heads, dk))
    f32 = [np.ascontiguousarray(x, np.float32) for x in (q, k, v, g, beta)]
    _delta(state, *f32, o)
    return o


@njit(**JIT)
def _channel_scan(state, x, dt, a, b, c, y):  # pragma: no cover - compiled
    """state [D, N] in place; x/dt/y [n, D], a [D, N], b/c [n, N]."""
    n, width = x.shape
    dims = state.shape[1]
    for t in range(n):
        for i in range(width):
            u = dt[t, i] * x[t, i]
            acc = np.float32(0.0)
            for s in range(dims):
                v = state[i, s] * np.float32(np.exp(dt[t, i] * a[i, s])) + u * b[t, s]
                state[i, s] = v
                acc += v * c[t, s]
            y[t, i] = acc


def channel_scan(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                 c: np.ndarray) -> np.ndarray:
    """Mamba's per-channel selective scan (state in place) -> y [n, D] (archrun_recurrent.mamba.scan_reference)."""
    n, width = x.shape
    dims = state.shape[1]
    if state.shape != (width, dims) or dt.shape != (n, width) or a.shape != (width, dims) \
            or b.shape != (n, dims) or c.shape != (n, dims) or state.dtype != np.float32:
        raise ValueError(f"channel_scan: state {state.shape}, x {x.shape}, dt {dt.shape}, a {a.shape}, "
                         f"b {b.shape}, c {c.shape} do not agree")
    y = np.empty((n, width), np.float32)
    f32 = [np.ascontiguousarray(v, np.float32) for v in (x, dt, a, b, c)]
    _channel_scan(state, *f32, y)
    return y
