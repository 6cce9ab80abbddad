"""Mamba2's selective scan as a numba kernel (the contract of archrun_recurrent.mamba2.scan_reference)."""

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
