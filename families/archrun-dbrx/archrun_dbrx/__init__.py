"""archrun family plugin for DBRX (descriptions only, no math).

What dbrx files do not say (llama.cpp src/models/dbrx.cpp, HF modeling_dbrx.py): sequential
pre-LayerNorm blocks whose norms have a weight and no bias (the FFN's pre-norm, HF's `norm_2`, is
the file's `attn_output_norm`) (the norm named by the file's
`layer_norm_epsilon` key, biases by presence); Q/K/V fused in `attn_qkv` and clipped to
±`attention.clamp_kqv` before they split; rope NEOX pairing (HF's rotate_half; the converter
does not permute Q/K); grouped K/V heads; every layer a mixture of SwiGLU experts: softmax router
over all experts, top-k, the selected weights renormalised to sum 1 (HF's
`moe_normalize_expert_weights` 1: an L1 norm of positive weights); no shared expert, no biases.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "dbrx": FamilyHints(name="dbrx", rope_pairing="neox", activation="silu", embed_scale=1.0, gating="softmax",
                        moe_weights_norm=True, tensor_names={"ffn_norm": "blk.{i}.attn_output_norm.weight"},
                        **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
