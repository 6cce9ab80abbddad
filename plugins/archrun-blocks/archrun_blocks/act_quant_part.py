"""The "rms_act8" norm's kernel part and fast op (the math: archrun_blocks.act_quant).

The part is RMSNorm's part (archrun_blocks.parts.rms_norm: the sum of squares in float64), then the row
fake-quantized to int8 by its absmax exactly as act_quant.quantize_rows_int8 does it in float32:
s = 127 * (1 / max(max|y|, 1e-5)), out = clamp(rint(y * s), -128, 127) / s (round half to even). The fast op
runs the same part over rows, so the fused decode path and the op-by-op path compute the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES, part
from archrun_blocks import elementwise, parts

F32 = np.float32


@njit(SIGNATURES["norm"], **JIT)
def rms_act8_part(p, x, w, b, out):
    """out = RMSNorm(x) * (w + offset) (+ b), then quantized to int8 per row (the values q / s); p = (eps,
    weight offset) as archrun_blocks.parts.rms_norm's. out may be x."""
    parts.rms_norm(p, x, w, b, out)
    m = F32(0.0)
    for i in range(out.shape[0]):
        m = max(m, abs(out[i]))
    s = F32(127.0) * (F32(1.0) / max(m, F32(1e-5)))
    for i in range(out.shape[0]):
        out[i] = min(max(np.rint(out[i] * s), F32(-128.0)), F32(127.0)) / s


def rms_act8_fast(eps: float):
    """The fast "rms_act8" norm: the kernel part over rows (archrun_blocks.elementwise), fused in decode."""
    p = part(rms_act8_part, eps, 0.0)

    def norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        shape = x.shape
        x2 = np.ascontiguousarray(x, dtype=F32).reshape(-1, shape[-1])
        return elementwise.norm_rows(p.handle, p.params, x2, w, b).reshape(shape)

    norm.fused = p
    return norm
