"""The kernel part of gating "sqrtsoftplus" (the math: archrun_deepseek4_ops.gating)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels.decode.parts import SIGNATURES


@njit(SIGNATURES["gating"], cache=True, nogil=True)
def sqrtsoftplus_part(p, logits, probs):
    """probs = sqrt(softplus(logits)) per expert (softplus(x) = x above 20); p unused. No fastmath: the
    MoE kernel picks experts from these scores, so they round as the reference's."""
    for e in range(logits.shape[0]):
        x = logits[e]
        s = x if x > np.float32(20.0) else np.float32(math.log1p(math.exp(np.float64(x))))
        probs[e] = np.float32(math.sqrt(s))
