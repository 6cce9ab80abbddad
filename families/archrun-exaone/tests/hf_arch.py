"""archrun-exaone's tiny fixtures: HF Exaone4ForCausalLM, converted by llama.cpp's own converter.

The sliding variant has three sliding-window layers (window 8, shorter than the fixture's 40
tokens, so the window matters) before each full-attention layer. It has 64 layers (and a narrow
width to stay small) because llama.cpp turns sliding windows on for exaone4 only in 64-layer
models (the 32B; src/models/exaone4.cpp): with fewer layers it runs every layer global with rope,
unlike transformers, so it could not cross-check a shallower sliding fixture.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

EXAONE4 = HfArch("exaone4", "exaone4", "Exaone4ForCausalLM", "Exaone4Config", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2})

# K-EXAONE: sliding window 128 in a LLLG pattern (global layers without rope), 128 experts top 8 with
# one shared expert, sigmoid routing with a selection bias, weights renormalised and scaled by 2.5,
# the first layer dense. The fixture: window 8 over the 40 tokens, the same pattern over 4 layers.
# llama.cpp's loader requires `expert_gating_func`, which its converter writes only from a config's
# `scoring_func` (transformers' ExaoneMoeConfig has none): the cross-check's copy states sigmoid (2).
EXAONE_MOE = HfArch("exaone-moe", "exaone_moe", "ExaoneMoeForCausalLM", "ExaoneMoeConfig", converter="llama.cpp",
                    defaults={"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "intermediate_size": 64, "moe_intermediate_size": 16,
                              "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
                              "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                              "sliding_window": 8, "sliding_window_pattern": 4},
                    llamacpp_keys={"expert_gating_func": 2})

ARCHES = (EXAONE4, EXAONE_MOE)

FIXTURES = (
    TinyFixture("exaone4_global", "exaone4", 1),
    TinyFixture("exaone4_sliding_64layer", "exaone4", 2, {
        "num_hidden_layers": 64, "sliding_window": 8, "tie_word_embeddings": True, "hidden_size": 16,
        "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1}),
    TinyFixture("exaone_moe_sliding_shared", "exaone_moe", 1),
)
