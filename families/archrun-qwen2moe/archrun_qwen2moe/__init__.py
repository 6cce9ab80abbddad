"""archrun family plugin for Qwen2-MoE (descriptions only, no math).

What qwen2moe files do not say (llama.cpp src/models/qwen2moe.cpp, HF modeling_qwen2_moe.py):
rope NEOX pairing; Q/K/V biases by presence; a softmax router over the experts, top-k, selected
weights not renormalised (HF `norm_topk_prob` false); a shared expert on every token whose
output is gated by sigmoid(x . `ffn_gate_inp_shexp`) (by tensor presence); SwiGLU experts.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "qwen2moe": FamilyHints(name="qwen2moe", rope_pairing="neox", activation="silu", embed_scale=1.0,
                            gating="softmax", **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
