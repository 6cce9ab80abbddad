"""archrun-ernie's tiny fixtures: HF Ernie4_5ForCausalLM, converted by llama.cpp's own converter.

Ernie4_5Config's default head_dim is 128; the fixtures set a tiny one (written as
attention.key_length/value_length). llama.cpp's ernie4_5 loader takes no bias tensors
(`use_bias = true` files do not load there; released checkpoints have none), so no fixture has them.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

ERNIE4_5 = HfArch("ernie4_5", "ernie4_5", "Ernie4_5ForCausalLM", "Ernie4_5Config", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "head_dim": 16, "pad_token_id": 0})

# MoE: one shared expert (llama.cpp sizes the shared FFN as expert width x shared count, the
# converter writes their product: they agree for one)
ERNIE4_5_MOE = HfArch("ernie4_5-moe", "ernie4_5_moe", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig",
                      converter="llama.cpp",
                      defaults={"num_hidden_layers": 2, "head_dim": 16, "pad_token_id": 0, "moe_num_experts": 4,
                                "moe_k": 2, "moe_intermediate_size": 32, "moe_layer_start_index": 1,
                                "moe_num_shared_experts": 1})

ARCHES = (ERNIE4_5, ERNIE4_5_MOE)

FIXTURES = (
    TinyFixture("ernie4_5_gqa", "ernie4_5", 1),
    TinyFixture("ernie4_5_tied_hd8", "ernie4_5", 2,
                {"tie_word_embeddings": True, "num_attention_heads": 8, "head_dim": 8,
                 "num_hidden_layers": 3}),
    TinyFixture("ernie4_5_moe_dense_first", "ernie4_5_moe", 1),
    TinyFixture("ernie4_5_moe_8experts", "ernie4_5_moe", 2, {"moe_num_experts": 8, "moe_k": 3,
                                                              "moe_layer_start_index": 0, "num_hidden_layers": 3}),
)
