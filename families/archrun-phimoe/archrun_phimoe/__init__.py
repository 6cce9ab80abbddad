"""archrun family plugin for PhiMoE (Phi-3.5-MoE; descriptions only, no math).

What phimoe files do not say (HF modeling_phimoe.py in eval mode is the reference; llama.cpp
src/models/phi3.cpp differs where noted): sequential pre-norm blocks whose norms are LayerNorms
with weight and bias (the converter writes the epsilon under `layer_norm_rms_epsilon`, and
llama.cpp's graph runs RMSNorm plus the bias); Q/K/V/output and head biases by presence; rope
pairing NEOX; every layer a mixture of SwiGLU experts routed by sparsemixer (archrun-blocks'
gating `sparsemixer`: the best two experts, each weighted by a softmax over the experts within a
2 x `router_jitter_noise` relative gap of it, 0.01 in the released model; llama.cpp routes by
softmax top-k renormalised instead), without renormalisation.
LongRoPE as HF's PhimoeRotaryEmbedding computes it: the short factors at every length (the file's
`rope_factors_long` is unused) and cos/sin scaled by Phi-3.5-MoE's `short_mscale`
1.243163121016122 (= its `long_mscale`; the converter drops both and writes the LongRoPE default
sqrt(1 + ln 32 / ln 4096) = 1.19 as `rope.scaling.attn_factor`, which llama.cpp uses).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

SHORT_MSCALE = 1.243163121016122  # Phi-3.5-MoE's config.json rope_scaling short_mscale (= long_mscale)

HINTS = {
    "phimoe": FamilyHints(name="phimoe", rope_pairing="neox", activation="silu", embed_scale=1.0, norm="layer",
                          gating="sparsemixer", rope_attn_scale=SHORT_MSCALE,
                          tensor_names={"rope_factors_long": "rope_factors_short.weight"},
                          ignored_tensors=("rope_factors_long.weight",), **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
