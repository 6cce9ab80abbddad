"""archrun-deepseek2's tiny fixtures: HF DeepseekV3ForCausalLM / DeepseekV2ForCausalLM, converted by
llama.cpp's own converter (which splits kv_b_proj into attn_k_b / attn_v_b: the MLA layout).

Released DeepSeek-V3 configs carry ``scoring_func: "sigmoid"`` (transformers' DeepseekV3Config
drops it; HF's V3 router is always sigmoid): ``checkpoint_config`` adds it back so the converter
writes ``expert_gating_func``. V2 routes by softmax (no key: llama.cpp's default). The llama.cpp
cross-check of Lite fixtures states ``attention.q_lora_rank`` 0 (see ``_lite_rank``).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture, default_rope_parameters


def _scoring(hp):
    return {"scoring_func": "sigmoid"}


def _lite_rank(hp):
    """llama.cpp tells Lite files (no q LoRA) by their layer count (26/27/48) and otherwise requires
    ``attention.q_lora_rank``; its converter writes none without a q LoRA: say 0 (no q LoRA)."""
    return {} if hp.get("q_lora_rank") else {"attention.q_lora_rank": 0}


def _rope(kw):
    """transformers' rope_parameters: default, or YaRN from a fixture's flat ``yarn`` dict."""
    yarn = kw.pop("yarn", None)
    params = default_rope_parameters(kw)
    if yarn is not None:
        params.update(rope_type="yarn", **yarn)
    return params


_COMMON = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
           "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 12,
           "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 1,
           "first_k_dense_replace": 1}

DEEPSEEK_V3 = HfArch("deepseek2", "deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3Config", converter="llama.cpp",
                     defaults={**_COMMON, "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0},
                     checkpoint_config=_scoring, rope_parameters=_rope, llamacpp_keys=_lite_rank)

DEEPSEEK_V2 = HfArch("deepseek2", "deepseek_v2", "DeepseekV2ForCausalLM", "DeepseekV2Config", converter="llama.cpp",
                     defaults={**_COMMON, "topk_method": "greedy"}, llamacpp_keys=_lite_rank)

# GLM-4.7-Flash: V3's attention and router (sigmoid + selection bias, no expert_gating_func written:
# llama.cpp tells the released model by its shape, 47/48 layers and 154880 tokens, which a tiny one
# lacks, so its cross-check states the sigmoid gating); its config.json carries first_k_dense_replace
# (HF's config keeps mlp_layer_types instead)
GLM4_MOE_LITE = HfArch("deepseek2", "glm4_moe_lite", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteConfig",
                       converter="llama.cpp", defaults={**_COMMON, "n_group": 1, "topk_group": 1,
                                                        "routed_scaling_factor": 1.8, "num_experts_per_tok": 4,
                                                        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0},
                       checkpoint_config=lambda hp: {"first_k_dense_replace": 1}, rope_parameters=_rope,
                       llamacpp_keys=lambda hp: {**_lite_rank(hp), "expert_gating_func": 2})

ARCHES = (DEEPSEEK_V3, DEEPSEEK_V2, GLM4_MOE_LITE)

_YARN = {"factor": 4.0, "original_max_position_embeddings": 32,
         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}

FIXTURES = (
    # q LoRA, sigmoid router + selection bias, shared expert, a leading dense layer
    TinyFixture("deepseek3_qlora", "deepseek_v3", 1, {"routed_scaling_factor": 2.5}),
    # Lite (no q LoRA: attn_q), expert groups, no renormalisation, two shared experts, wider rope
    TinyFixture("deepseek3_lite_groups", "deepseek_v3", 2, {
        "q_lora_rank": None, "n_group": 4, "topk_group": 2, "norm_topk_prob": False, "n_shared_experts": 2,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 8, "v_head_dim": 20, "num_attention_heads": 2,
        "num_key_value_heads": 2}),
    # YaRN: rotary magnitude 1, scores scaled by mscale^2 (mscale_all_dim)
    TinyFixture("deepseek3_yarn", "deepseek_v3", 3, {"yarn": _YARN, "max_position_embeddings": 128}),
    # DeepSeek-V2: softmax router (no gating key), greedy top-k
    TinyFixture("deepseek2_lite_softmax", "deepseek_v2", 4, {"q_lora_rank": None, "routed_scaling_factor": 1.0}),
    # GLM-4.7-Flash (glm4_moe_lite): q LoRA, 8 experts top 4 scaled 1.8, a shared expert, a dense first layer
    TinyFixture("glm4_moe_lite_flash", "glm4_moe_lite", 5),
)
