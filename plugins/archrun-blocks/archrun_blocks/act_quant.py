"""RMSNorm whose output is quantized to int8 per row: BitNet b1.58's activation quantization.

In BitNet every ternary projection reads its input quantized per token to 8 bits by its largest
magnitude (HF transformers' `ActQuant` in AutoBitLinear; "absmax" in the BitNet b1.58 paper), and
every such input is a norm's output (the pre-norms, and the sub-layer norms before the attention
output and the FFN's down projection). The norm op therefore quantizes what it returns:

    y = rms_norm(x) * w
    s = 127 * (1 / max(max|y|, 1e-5))        per row
    out = clamp(round(y * s), -128, 127) / s  (round half to even, float32 throughout)

The final norm feeds a float head (`final_norm` convention: the plain "rms").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from archrun_blocks.reference import rms_norm

F32 = np.float32


def quantize_rows_int8(y: np.ndarray) -> np.ndarray:
    """Each row of y fake-quantized to int8 by its absmax (the values q / s, float32)."""
    # 127 * (1 / m): how torch computes HF's `127 / m` (a scalar over a tensor is its reciprocal times
    # the scalar); a true division differs by an ulp at times, enough to flip a rounding
    s = F32(127.0) * (F32(1.0) / np.maximum(np.max(np.abs(y), axis=-1, keepdims=True), F32(1e-5)))
    return (np.clip(np.round(y * s), F32(-128.0), F32(127.0)) / s).astype(F32, copy=False)


def rms_act8(eps: float) -> Any:
    """The "rms_act8" norm: RMSNorm, then each row quantized to int8 (see the module docstring)."""
    rms = rms_norm(eps)

    def norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        return quantize_rows_int8(rms(x, w, b))

    return norm
