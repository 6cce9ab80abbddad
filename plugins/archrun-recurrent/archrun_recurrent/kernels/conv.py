"""The gated causal depthwise convolution of a short-convolution mixer, as a numba kernel."""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT


@njit(**JIT)
def _gated_conv(ext, w, c, out):  # pragma: no cover - compiled
    """out[t, i] = c[t, i] * sum_j w[i, j] * ext[t + j, i]; ext [L-1+n, d], w [d, L], c/out [n, d]."""
    n, d = c.shape
    taps = w.shape[1]
    for t in range(n):
        for i in range(d):
            acc = np.float32(0.0)
            for j in range(taps):
                acc += w[i, j] * ext[t + j, i]
            out[t, i] = c[t, i] * acc


def gated_conv(ext: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """c * causal depthwise convolution (the contract of archrun_recurrent.shortconv.conv_reference)."""
    n, d = c.shape
    if ext.shape != (n + w.shape[1] - 1, d) or w.shape[0] != d:
        raise ValueError(f"gated_conv: ext {ext.shape}, w {w.shape}, c {c.shape} do not agree")
    out = np.empty((n, d), np.float32)
    _gated_conv(np.ascontiguousarray(ext, np.float32), np.ascontiguousarray(w, np.float32),
                np.ascontiguousarray(c, np.float32), out)
    return out
