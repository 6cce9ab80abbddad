"""archrun family plugin for IBM Granite and Granite MoE (descriptions only, no math).

What granite files do not say (llama.cpp src/models/granite.cpp, HF modeling_granite.py): a
llama block (rope NORM pairing on the converter's permuted Q/K, SwiGLU, sequential RMSNorm
blocks) with four multipliers the file states by key — `embedding_scale` (embeddings),
`residual_scale` (each branch before it joins), `attention.scale` (the attention's score
scale) — and `logit_scale`, which granite's logits are *divided* by (HF `logits_scaling`).
granitemoe (llama.cpp src/models/granite.cpp with experts): the same block with a MoE FFN whose
router keeps the top-k logits and softmaxes them — softmax, top-k, renormalise.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "granite": FamilyHints(name="granite", rope_pairing="norm", activation="silu", embed_scale=1.0,
                           logit_scale_key="divide", **TRANSFORMER),
    "granitemoe": FamilyHints(name="granitemoe", rope_pairing="norm", activation="silu", embed_scale=1.0,
                              logit_scale_key="divide", gating="softmax", moe_weights_norm=True, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
