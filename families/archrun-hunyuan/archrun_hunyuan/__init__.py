"""archrun family plugin for HunYuan dense and MoE (`hunyuan-dense`, `hunyuan-moe`; descriptions only, no math).

What hunyuan-dense files do not say (llama.cpp src/models/hunyuan-dense.cpp, HF
modeling_hunyuan_v1_dense.py): a llama-like block (pre-RMSNorm, SwiGLU, rope NEOX pairing) whose
per-head Q/K RMS norms apply to the *rotated* Q and K; the NTK "alpha" rope scaling arrives
already folded into `rope.freq_base` by the converter.

hunyuan-moe (llama.cpp src/models/hunyuan-moe.cpp, HF modeling_hunyuan_v1_moe.py): the same
attention; every layer's FFN is a softmax router over all experts, top-k, the selected weights
renormalised to sum 1, plus one always-on shared SwiGLU expert (`ffn_*_shexp`) added unweighted.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "hunyuan-dense": FamilyHints(name="hunyuan-dense", rope_pairing="neox", activation="silu", embed_scale=1.0,
                                 qk_norm_after_rope=True, **TRANSFORMER),
    "hunyuan-moe": FamilyHints(name="hunyuan-moe", rope_pairing="neox", activation="silu", embed_scale=1.0,
                               qk_norm_after_rope=True, gating="softmax", moe_weights_norm=True, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
