"""Gemma 4's per-layer inputs (E2B / E4B) as the stream op "gemma4_ple" (archrun.vocab, slot "stream").

HF Gemma4TextDecoderLayer, llama.cpp gemma4.cpp: after a block's two branches join the stream, the layer's
per-layer input term (archrun_gemma4_ops.per_layer) is added, and only then is the stream multiplied by the
layer's `layer_output_scale`:

    g  = x + attention_branch(x)          (pre-norm, attention, post-norm)
    y  = g + ffn_branch(g)                (pre-norm, FFN, post-norm)
    x' = (y + term_i(y)) * layer_scalar_i

The op carries the residual itself (it calls the block's branches, OpCapabilities(branches=True)), so the
blocks' residual op is not used. A file without per-layer inputs (`embedding_length_per_layer_input` 0 or
absent: the 31B and 26B-A4B models) needs no stream op: the layout declines it and those models run one
stream, their layer scalar in the residual op `gemma4_scaled`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from archrun.errors import MetadataError
from archrun_gemma4_ops.per_layer import PerLayerInputs, expect_tensors
from archrun_gemma4_ops.residual import layer_scalar

F32 = np.float32
WIDTH_KEY = "embedding_length_per_layer_input"


class PleLayout:
    """{"params": {"per_layer_width": p}} from the file, or None (no per-layer inputs: one stream)."""

    def describe(self, ctx: Any) -> dict[str, Any] | None:
        m, d = ctx.meta, ctx.n_embd
        width = m.get(WIDTH_KEY, int, 0)
        if width == 0:
            return None
        if width < 0:
            raise MetadataError(f"{m.key(WIDTH_KEY)} = {width}: a per-layer input width is positive")
        expect_tensors(ctx.tensors, d, m.get("block_count", int), width)
        return {"params": {"per_layer_width": width}}


class Gemma4Ple:
    """The stream op (module docstring): state (x [n, d], P [n, L, p])."""

    def __init__(self, descriptor: Any, per_layer_width: float = 1):
        self.per_layer = PerLayerInputs(descriptor.n_embd, descriptor.n_layer, int(per_layer_width))

    def bind(self, b: Any) -> None:
        self.per_layer.bind(b)
        self.scalars = [layer_scalar(b, i) for i in range(self.per_layer.n_layer)]

    def enter(self, x: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, F32)
        return x, self.per_layer.inputs(x, ids)

    def layer(self, i: int, state: tuple[np.ndarray, np.ndarray], block: Any) -> tuple[np.ndarray, np.ndarray]:
        x, inputs = state
        g = (x + block.attention(x)).astype(F32)
        y = (g + block.ffn(g)).astype(F32)
        return ((y + self.per_layer.term(i, y, inputs)) * self.scalars[i]).astype(F32), inputs

    def leave(self, state: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return state[0]
