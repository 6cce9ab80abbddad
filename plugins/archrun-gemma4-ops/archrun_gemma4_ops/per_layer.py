"""Per-layer inputs (Gemma 4 E2B/E4B, Gemma 3n): a token-indexed input for every layer, gating a projection
added to the stream after the layer's block.

HF Gemma4TextModel.get_per_layer_inputs / project_per_layer_inputs (Gemma3nTextModel's are the same), llama.cpp
gemma4.cpp `build_inp_per_layer` / `project_per_layer_inputs`. L blocks, d the model width, p the per-layer input
width (`embedding_length_per_layer_input`), x the scaled token embeddings:

    P [n, L, p] = (norm(per_layer_model_proj(x) / sqrt(d), per_layer_proj_norm)
                   + per_layer_token_embd[ids] sqrt(p)) / sqrt(2)
    term_i(v)   = norm(proj_i(gelu_tanh(inp_gate_i(v)) * P[:, i]), post_norm_i)      [n, d]

The token table is read by rows (the ids of each step). Released models' table covers the text vocabulary;
the converter pads it with zero rows for the multimodal ids, which read those zeros here as in llama.cpp.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from archrun.errors import ShapeMismatch

F32 = np.float32


def expect_tensors(t: Any, d: int, n_layer: int, width: int) -> None:
    """Check the per-layer input tensors' shapes at compile time (ctx.tensors of a layout)."""
    t.expect("per_layer_model_proj", None, (d, n_layer * width))
    t.expect("per_layer_proj_norm", None, (width,))
    if t.shape("per_layer_token_embd")[0] != n_layer * width:
        raise ShapeMismatch(f"per_layer_token_embd has shape {tuple(t.shape('per_layer_token_embd'))}, expected "
                            f"({n_layer * width}, n_vocab)")
    for i in range(n_layer):
        t.expect("inp_gate", i, (d, width))
        t.expect("proj", i, (width, d))


class PerLayerInputs:
    """P and each layer's term (module docstring); bind(b) at load."""

    def __init__(self, d: int, n_layer: int, width: int):
        self.d, self.n_layer, self.width = d, n_layer, width

    def bind(self, b: Any) -> None:
        self.norm = b.op("norm", b.d.norm, b.d.norm_eps)
        self.gelu = b.op("activation", "gelu_tanh")
        self.table = b.matrix("per_layer_token_embd", lazy=True)     # rows [vocab, L*p]
        self.model_proj = b.matrix("per_layer_model_proj")
        self.proj_norm = b.vector("per_layer_proj_norm")
        self.layers = [(b.matrix("inp_gate", i), b.matrix("proj", i), b.vector("post_norm", i))
                       for i in range(self.n_layer)]

    def inputs(self, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """P [n, L, p] of the rows x [n, d] (the scaled embeddings of tokens ids [n])."""
        n, shape = len(x), (len(x), self.n_layer, self.width)
        proj = (self.model_proj(x) * F32(1.0 / math.sqrt(self.d))).reshape(shape)
        proj = self.norm(np.ascontiguousarray(proj), self.proj_norm)
        rows = self.table.rows(np.asarray(ids, dtype=np.int64)).reshape(n, self.n_layer, self.width)
        return ((proj + rows * F32(math.sqrt(self.width))) * F32(1.0 / math.sqrt(2.0))).astype(F32)

    def term(self, i: int, v: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """term_i(v) [n, d], inputs = P [n, L, p]."""
        gate, proj, post_norm = self.layers[i]
        y = self.gelu(gate(np.ascontiguousarray(v, dtype=F32))) * inputs[:, i]
        return self.norm(proj(np.ascontiguousarray(y, dtype=F32)), post_norm)
