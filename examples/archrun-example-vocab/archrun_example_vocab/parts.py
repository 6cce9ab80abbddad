"""The kernel part of gelu_quick: its math for one token, callable from the core's fused layer kernel.

A part is a numba function compiled *eagerly* with its slot's signature,
archrun.kernels.decode.parts.SIGNATURES["activation"] = void(p float64[:], x float32[:], out float32[:]):
the core's layer kernel (archrun.kernels.decode.layer) receives it as a first-class function value
and calls it on the FFN's gate row, so this plugin's math runs inside the one-call-per-layer
decode step without the core knowing what it computes. `p` carries the op's scalar parameters
(archrun.kernels.decode.parts.part(fn, *params)); here p[0] is the sigmoid's slope 1.702.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels.decode.parts import JIT, SIGNATURES

_F32 = np.float32


@njit(SIGNATURES["activation"], **JIT)
def gelu_quick(p, x, out):
    """out = x * sigmoid(p[0] x); out may be x. exp only of non-positive arguments (no overflow)."""
    a = _F32(p[0])
    for i in range(x.shape[0]):
        g = x[i]
        if g >= _F32(0.0):
            out[i] = g / (_F32(1.0) + np.exp(-a * g))
        else:
            e = np.exp(a * g)
            out[i] = g * e / (_F32(1.0) + e)
