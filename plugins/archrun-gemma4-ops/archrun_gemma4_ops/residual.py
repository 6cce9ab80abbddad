"""Gemma 4's residual: the sequential block, its output times the layer's learned scalar.

llama.cpp gemma4-iswa.cpp (`layer_output_scale`, HF Gemma4TextDecoderLayer.layer_scalar): after
both branches (and the per-layer input, when the model has one) join the stream, the whole stream
is multiplied by one learned number per layer. A file without the tensor scales by 1.
"""

from __future__ import annotations

import numpy as np

from archrun.errors import ShapeMismatch
from archrun_blocks import reference

F32 = np.float32
ROLE = "layer_output_scale"


def layer_scalar(b, layer: int) -> np.float32:
    """The layer's `layer_output_scale` (one value), 1 if the file has none."""
    if b.d.tensor_name(ROLE, layer) not in b.gguf.tensors:
        return F32(1.0)
    w = b.vector(ROLE, layer)
    if w.size != 1:
        raise ShapeMismatch(f"layer {layer}: {ROLE} must hold one value, it has {w.size}")
    return F32(w.reshape(-1)[0])


class ScaledSequential(reference.Sequential):
    """x -> g = x + s a -> (g + s f) * layer_scalar."""

    def __init__(self, scale: float = 1.0):
        super().__init__(scale)
        self.layer_scalar = F32(1.0)

    def bind(self, b, layer: int) -> None:
        self.layer_scalar = layer_scalar(b, layer)

    def combine(self, x: np.ndarray, a: np.ndarray, f: np.ndarray) -> np.ndarray:
        return super().combine(x, a, f) * self.layer_scalar
