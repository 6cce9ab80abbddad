"""Gemma 4's residual: the sequential block, its output times the layer's learned scalar.

llama.cpp gemma4-iswa.cpp (`layer_output_scale`, HF Gemma4TextDecoderLayer.layer_scalar): after
both branches (and the per-layer input, when the model has one) join the stream, the whole stream
is multiplied by one learned number per layer. A file without the tensor scales by 1.

The fast op (`scaled_fast`) carries the kernel parts the fused decode block joins with: the sequential
block's FFN input (archrun_blocks.parts.sequential_input: the FFN reads the unscaled stream) and the combine
times the layer scalar (archrun_gemma4_ops.kernels.parts.scaled_combine), both with the parameters (residual
scale, layer scalar), set when the layer binds (the layer kernel gives the FFN input's to both).
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


class FastScaledSequential(ScaledSequential):
    """ScaledSequential with its kernel parts (`fused_input`, `fused`: the combine with the layer's scalar)."""

    def __init__(self, scale: float = 1.0):
        from archrun.kernels.decode.parts import part
        from archrun_blocks import parts
        from archrun_gemma4_ops.kernels.parts import scaled_combine

        super().__init__(scale)
        # the layer kernel passes the FFN input's parameters to both parts: they share (s, layer scalar)
        self._parts = lambda c: (part(parts.sequential_input, float(self.scale), float(c)),
                                 part(scaled_combine, float(self.scale), float(c)))
        self.fused_input, self.fused = self._parts(self.layer_scalar)

    def bind(self, b, layer: int) -> None:
        super().bind(b, layer)
        self.fused_input, self.fused = self._parts(self.layer_scalar)


def scaled_fast(scale: float = 1.0) -> FastScaledSequential:
    """The fast op: the same combine op by op (numpy), and its kernel parts for the fused decode block."""
    return FastScaledSequential(scale)
