"""xIELU's kernel part and fast op (the math and its parameters: archrun_blocks.xielu)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES, part
from archrun_blocks import elementwise
from archrun_blocks.xielu import F32, INIT, effective


@njit(SIGNATURES["activation"], **JIT)
def xielu_part(p, x, out):
    """The kernel part: p = (a_n, a_p, beta, eps) (effective values: see `effective`)."""
    a_n, a_p, b, e = np.float32(p[0]), np.float32(p[1]), np.float32(p[2]), np.float32(p[3])
    for i in range(x.shape[0]):
        g = x[i]
        if g > np.float32(0.0):
            out[i] = a_p * g * g + b * g
        else:
            out[i] = (np.float32(math.expm1(min(g, e))) - g) * a_n + b * g


def xielu_fast(alpha_n: float = INIT["alpha_n"], alpha_p: float = INIT["alpha_p"], beta: float = INIT["beta"],
               eps: float = INIT["eps"]):
    """The fast op: the kernel part over rows (archrun_blocks.elementwise), fused in decode."""
    p = part(xielu_part, *effective(alpha_n, alpha_p, beta, eps))

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        return elementwise.activation(p.handle, p.params, np.asarray(x, dtype=F32),
                                      None if up is None else np.asarray(up, dtype=F32))

    act.fused = p
    return act
