"""archrun-deepseek32's tiny fixtures: HF DeepseekV32ForCausalLM, converted by llama.cpp's own converter
(which splits kv_b_proj into attn_k_b / attn_v_b and writes the indexer's head count, key length and
top-k as ``attention.indexer.*`` keys).

DeepSeek-V3.2-Exp's settings, scaled down: a q LoRA (the indexer's queries read it), YaRN (factor 40,
mscale = mscale_all_dim = 1), sigmoid routing with a selection bias, expert groups, leading dense
layers, epsilon 1e-6; the indexer's top-k (2048 of 163840 positions there) below the 40-token prompt
here (16 and 24; llama.cpp rotates the indexer's keys by a Hadamard matrix of 64 or more
dims, so its heads are 64 wide) so the selection drops keys from position 16 (24) on. transformers' DeepseekV32Config
drops ``scoring_func``: ``checkpoint_config`` adds it back so the converter writes
``expert_gating_func`` (sigmoid), as released configs carry it.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture, default_rope_parameters

YARN = {"factor": 40.0, "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0}


def _rope(kw):
    params = default_rope_parameters(kw)
    params.update(rope_type="yarn", **YARN)
    return params


DEEPSEEK_V32 = HfArch(
    "deepseek32", "deepseek_v32", "DeepseekV32ForCausalLM", "DeepseekV32Config", converter="llama.cpp",
    defaults={"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
              "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 12,
              "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 1,
              "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
              "index_n_heads": 16, "index_head_dim": 64, "index_topk": 16, "max_position_embeddings": 1280},
    checkpoint_config=lambda hp: {"scoring_func": "sigmoid"}, rope_parameters=_rope)

ARCHES = (DEEPSEEK_V32,)

FIXTURES = (
    # 16 indexer heads of 64 (8 rotary), top 16 of up to 40 keys
    TinyFixture("deepseek32_top16", "deepseek_v32", 1),
    # 16 indexer heads of 64, top 24, two leading dense layers, wider main heads
    TinyFixture("deepseek32_top24_16heads", "deepseek_v32", 2, {
        "index_topk": 24, "first_k_dense_replace": 2, "num_attention_heads": 8,
        "num_key_value_heads": 8}),
)
