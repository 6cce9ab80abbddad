"""Gemma 3n's FFN activation: GeGLU (tanh GELU) whose gate is first cut at a Gaussian quantile.

HF Gemma3nTextMLP._gaussian_topk, llama.cpp gemma3n-iswa.cpp (`gaussian_topk`): in a layer with
activation sparsity s > 0 the gate pre-activation g [n, f] becomes relu(g - (mean(g) + std(g) z)) per
row before the GELU, z the standard normal quantile of s (s = 0.95: z = 1.6448536; keeping ~5% of the
gate). HF's std is the population one (unbiased=False); llama.cpp divides by f - 1. The file stores z
per layer (`activation_sparsity_scale`, the converter's normal icdf: -inf for dense layers, whose gate
is not cut); `SparsityLayout` reads it at compile time as the op's parameters.
"""

from __future__ import annotations

import math

import numpy as np

from archrun_blocks import reference

F32 = np.float32
KEY = "{arch}.activation_sparsity_scale"


class SparsityLayout:
    """The layer's quantile: {"params": {"sparse": 1 or 0, "std_multiplier": z or 0}} (an ActivationLayout)."""

    def describe(self, ctx) -> dict:
        n = ctx.meta.get("block_count", int)
        z = ctx.meta.per_layer_floats(KEY, n, infinite=True)[ctx.layer]
        sparse = math.isfinite(z)  # -inf: sparsity 0 (a dense layer); +inf would cut every gate
        return {"params": {"sparse": float(sparse), "std_multiplier": z if sparse else 0.0}}


def gaussian_cut(g: np.ndarray, z: float) -> np.ndarray:
    """relu(g - (mean + std z)) over the last axis (population std), float32."""
    g = np.asarray(g, dtype=F32)
    if g.shape[-1] == 0:
        return g
    mean = g.mean(axis=-1, keepdims=True, dtype=np.float64)
    std = np.sqrt(np.mean((g - mean) ** 2, axis=-1, keepdims=True))
    return np.maximum(g - (mean + std * z).astype(F32), F32(0.0)).astype(F32)


def _sparse(act, sparse: float, std_multiplier: float):
    if not sparse:
        return act

    def cut(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        return act(gaussian_cut(x, std_multiplier), up)

    return cut


def gelu_tanh_sparse(sparse: float = 1.0, std_multiplier: float = 1.6448536):
    """The reference op: act(x, up=None) = gelu_tanh(cut(x)) (* up), cut = gaussian_cut in sparse layers."""
    return _sparse(reference.gelu_tanh(), sparse, std_multiplier)


def gelu_tanh_sparse_fast(sparse: float = 1.0, std_multiplier: float = 1.6448536):
    """The fast op: its kernel part (archrun_gemma3n_ops.kernels.sparse_gelu) over rows
    (archrun_blocks.elementwise), which is also what a fused decode step would call."""
    from archrun.kernels.decode.parts import part
    from archrun_blocks import elementwise  # imported on use: loading the plugin compiles no kernel
    from archrun_gemma3n_ops.kernels.sparse_gelu import gelu_tanh_cut

    p = part(gelu_tanh_cut, float(sparse), float(std_multiplier))

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        return elementwise.activation(p.handle, p.params, np.asarray(x, dtype=F32),
                                      None if up is None else np.asarray(up, dtype=F32))

    act.fused = p
    return act
