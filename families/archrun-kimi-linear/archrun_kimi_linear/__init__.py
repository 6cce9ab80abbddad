"""archrun family plugin for kimi-linear (Kimi Linear; descriptions only, no math).

What kimi-linear files do not say (llama.cpp src/models/kimi-linear.cpp, HF modeling_kimi_linear.py):
layers whose per-layer `attention.head_count_kv` is 0 are Kimi Delta Attention mixers ("kda", from the
archrun-recurrent vocabulary package: a gated delta rule with a per-channel decay; `ssm_a` stored without
`.weight`), the others multi-head latent attention with no rotary embedding on its rope dims (llama.cpp
and vLLM: rotary_emb None) whose kv_a norm has epsilon 1e-6 ("mla_fixed_lora_eps", from archrun-mla: HF
builds that norm with its default epsilon; llama.cpp takes the model's rms_norm_eps, 1e-5 in the released
config); FFNs are SwiGLU, dense for the leading layers, then
a sigmoid-routed top-k mixture (the file's expert_gating_func) with a selection bias, renormalised and
scaled by expert_weights_scale, plus shared experts.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "kimi-linear": FamilyHints(name="kimi-linear", rope_pairing="none", activation="silu", embed_scale=1.0,
                               gating="sigmoid", moe_weights_norm=True, recurrent="kda",
                               tensor_names={"ssm_a": "blk.{i}.ssm_a"},
                               **{**TRANSFORMER, "attention": "mla_fixed_lora_eps"}),
}

plugin = FamilyPlugin(HINTS)
