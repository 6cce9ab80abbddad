"""Gemma 4's mixture blocks (26B-A4B): the mixture op "gemma4_moe" (archrun.vocab, slot "moe").

HF Gemma4TextDecoderLayer (enable_moe_block) / Gemma4TextRouter / Gemma4TextExperts, llama.cpp gemma4.cpp. On
the FFN branch's input g [n, d] (before any norm: the op declares `own_ffn_norm` and applies the norms itself):

    dense  = post_ffw_norm_1(mlp(ffn_norm(g)))                     the layer's dense MLP (ffn_gate/up/down)
    r      = rms(g) * ffn_gate_inp.scale / sqrt(d)                 the router's input: an unweighted RMS norm
    p      = softmax(ffn_gate_inp r)  over all experts
    top k of p, renormalized to sum 1, times ffn_down_exps.scale[e] (HF's per_expert_scale)
    expert = post_ffw_norm_2(sum_e w_e down_e(act(gate_e x2) * up_e x2)),  x2 = pre_ffw_norm_2(g)
    return dense + expert                                          (the core then applies post_ffw_norm)

The experts' gate and up projections come as one `ffn_gate_up_exps` tensor (the core's MoeSpec.packed).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from archrun.errors import ShapeMismatch
from archrun_blocks.reference import route

F32 = np.float32


class Gemma4Moe:
    """The op (module docstring): moe(g, weights) -> [n, d]; bind(b, layer) at load."""

    def __init__(self, spec: Any, gating: Any, act: Any):
        self.spec, self.gating, self.act = spec, gating, act

    def bind(self, b: Any, i: int) -> None:
        self.norm = b.op("norm", b.d.norm, b.d.norm_eps)
        self.mlp = (b.matrix("ffn_gate", i), b.matrix("ffn_up", i), b.matrix("ffn_down", i))
        self.ffn_norm, self.post_dense = b.norm_weight("ffn_norm", i), b.norm_weight("post_ffw_norm_1", i)
        self.pre_experts, self.post_experts = b.norm_weight("pre_ffw_norm_2", i), b.norm_weight("post_ffw_norm_2", i)
        d, n_expert = b.d.n_embd, self.spec.n_expert
        self.router_scale = (b.vector("ffn_gate_inp.scale", i) * F32(1.0 / math.sqrt(d))).astype(F32)
        self.expert_scale = b.vector("ffn_down_exps.scale", i)
        if self.router_scale.shape != (d,) or self.expert_scale.shape != (n_expert,):
            raise ShapeMismatch(f"layer {i}: ffn_gate_inp.scale must hold {d} values and ffn_down_exps.scale "
                                f"{n_expert}, got {self.router_scale.size} and {self.expert_scale.size}")
        self.unit = np.ones(d, F32)

    def __call__(self, g: np.ndarray, w: Any) -> np.ndarray:
        gate, up, down = self.mlp
        h = self.norm(g, self.ffn_norm)
        dense = self.norm(down(self.act(gate(h), up(h))), self.post_dense)
        ids, weights = route(self.gating(w.gate_inp(self.norm(g, self.unit) * self.router_scale)), None, self.spec)
        weights = (weights * self.expert_scale[ids]).astype(F32)
        x = self.norm(g, self.pre_experts)
        out = np.zeros_like(x)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            out[rows] += weights[rows, slot][:, None] * w.down[e](self.act(w.gate[e](x[rows]), w.up[e](x[rows])))
        return dense + self.norm(out, self.post_experts)
