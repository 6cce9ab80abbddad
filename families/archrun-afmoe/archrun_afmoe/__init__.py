"""archrun family plugin for AFMoE (Arcee's Trinity models; descriptions only, no math).

What afmoe files do not say (llama.cpp src/models/afmoe.cpp, HF modeling_afmoe.py): attention gated
by a projection of its own (`gated_causal_gate_proj`, from archrun-recurrent: attn_output(attention
* sigmoid(attn_gate h))), with per-head Q/K RMS norms; every `global_attn_every_n_layers`-th layer
(4 in the released models; llama.cpp's fixed pattern) is global and uses no rotary embedding, the
others slide over the file's window and rotate NEOX; sandwich norms by presence; embeddings x
sqrt(n_embd) (HF's muP scaling, on in the released models; llama.cpp always applies it); SwiGLU; after
the leading dense layers, experts routed by sigmoid with a selection bias, always renormalised (HF
ignores route_norm) and scaled by route_scale, plus shared experts.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "afmoe": FamilyHints(name="afmoe", rope_pairing="neox", activation="silu", embed_scale="sqrt_n_embd",
                         gating="sigmoid", moe_weights_norm=True, swa_period=4, nope_global=True,
                         **{**TRANSFORMER, "attention": "gated_causal_gate_proj"}),
}

plugin = FamilyPlugin(HINTS)
