"""The kernel part of residual "gemma4_scaled" (archrun_gemma4_ops.residual): the sequential block's
combine times the layer's learned scalar, in the op-by-op path's float32 order.

Its FFN input is the sequential block's own (archrun_blocks.parts.sequential_input: x + s a, unscaled by
the layer scalar), so only the combine is here. Float flags: archrun.kernels._jit.JIT (nnan, ninf only).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES

_F32 = np.float32


@njit(SIGNATURES["residual"], **JIT)
def scaled_combine(p, x, a, f):
    """x <- ((x + s a) + s f) * c: p = (s, c), the residual scale and the layer's `layer_output_scale`."""
    s, c = _F32(p[0]), _F32(p[1])
    for i in range(x.shape[0]):
        x[i] = ((x[i] + a[i] * s) + f[i] * s) * c
