"""archrun family plugin for lfm2 and lfm2moe (Liquid LFM2, LFM2-MoE; descriptions only, no math).

What lfm2 files do not say (llama.cpp src/models/lfm2.cpp, HF modeling_lfm2.py): the layers whose
per-layer `attention.head_count_kv` is 0 are gated short convolutions ("shortconv", from the
archrun-recurrent vocabulary package: `shortconv.in_proj` -> B|C|x, a causal depthwise convolution
of `shortconv.l_cache` taps over B*x, times C, `shortconv.out_proj`); the others are causal
attention with per-head Q/K RMS norms and NEOX rope. SwiGLU FFN. The final norm is stored as
`token_embd_norm` (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2): it is the output norm, not a norm of
the embeddings. lfm2moe: after `leading_dense_block_count` dense layers, the FFN is a mixture of
experts routed by sigmoid (the file's `expert_gating_func`) with a selection bias, the chosen weights
renormalised.
"""

from __future__ import annotations

import attrs

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "lfm2": FamilyHints(name="lfm2", rope_pairing="neox", activation="silu", embed_scale=1.0, recurrent="shortconv",
                        tensor_names={"output_norm": "token_embd_norm.weight", "token_embd_norm": None},
                        **TRANSFORMER),
}
HINTS["lfm2moe"] = attrs.evolve(HINTS["lfm2"], name="lfm2moe", moe_weights_norm=True)

plugin = FamilyPlugin(HINTS)
