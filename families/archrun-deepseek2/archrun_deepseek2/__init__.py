"""archrun family plugin for deepseek2 (DeepSeek-V2/V2-Lite/V3; descriptions only, no math).

What deepseek2 files do not say (llama.cpp src/models/deepseek2.cpp, HF modeling_deepseek_v3.py):
attention is multi-head latent attention ("mla_fixed_lora_eps", from the archrun-mla vocabulary
package: the file's attn_q_a/attn_kv_a_mqa/attn_k_b/attn_v_b tensors and kv_lora_rank keys; HF's
DeepSeek-V2/V3 and GLM-4.7-Flash modules build the q_a/kv_a norms with epsilon 1e-6 whatever
rms_norm_eps says: DeepSeek's configs say 1e-6 too, GLM-4.7-Flash's 1e-5, which llama.cpp uses
there); rope NORM
pairing (HF's interleaved rope) on the qk_rope dims; SwiGLU; leading dense layers, then MoE with
shared experts: the gating is the file's expert_gating_func; when absent, sigmoid for layers with
a selection bias (`exp_probs_b`: GLM-4.7-Flash, HF `glm4_moe_lite`, whose converter writes no key;
llama.cpp recognises it by its shape, 47/48 layers and 154880 tokens) and softmax otherwise
(llama.cpp: DeepSeek-V2 files predate the key); renormalisation, scale and expert groups by key.
YaRN: the rotary magnitude stays 1 (HF's attention_factor is mscale / mscale_all_dim = 1; llama.cpp
cancels its own YaRN magnitude for deepseek2) and the scores take mscale^2 instead (the mla layout).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.text.reasoning import THINK_TAGS

HINTS = {
    "deepseek2": FamilyHints(name="deepseek2", rope_pairing="norm", activation="silu", embed_scale=1.0,
                             gating="softmax", gating_biased="sigmoid",
                             **{**TRANSFORMER, "attention": "mla_fixed_lora_eps"},
                             defaults={"rope.scaling.yarn_attn_factor": 1.0}),
}

plugin = FamilyPlugin(HINTS, reasoning=THINK_TAGS)
