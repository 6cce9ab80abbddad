"""The kernel part of activation "gelu_tanh_sparse" (the math: archrun_gemma3n_ops.sparsity)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES
from archrun_blocks.parts import gelu_tanh


@njit(SIGNATURES["activation"], **JIT)
def gelu_tanh_cut(p, x, out):
    """p = (sparse, z): with sparse != 0 the row is first cut, relu(x - (mean + std z)) with the population
    std (float64 sums, the cut point rounded to float32, as the reference); then archrun-blocks' GELU part."""
    n = x.shape[0]
    if p[0] == 0.0 or n == 0:
        gelu_tanh(p, x, out)
        return
    mean = 0.0
    for i in range(n):
        mean += np.float64(x[i])
    mean /= n
    var = 0.0
    for i in range(n):
        d = np.float64(x[i]) - mean  # float64 in Python too (NEP 50 would keep float32 - float in float32)
        var += d * d
    cut = np.float32(mean + math.sqrt(var / n) * p[1])
    kept = np.empty(n, np.float32)
    for i in range(n):
        v = x[i] - cut
        kept[i] = v if v > np.float32(0.0) else np.float32(0.0)
    gelu_tanh(p, kept, out)
