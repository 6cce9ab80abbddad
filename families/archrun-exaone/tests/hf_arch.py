"""archrun-exaone's tiny fixtures: HF ExaoneConfig (EXAONE 3.x), Exaone4ForCausalLM and
ExaoneMoeForCausalLM, converted by llama.cpp's own converter.

transformers runs EXAONE 3.x with its Llama implementation (``LlamaForCausalLM`` on an
``ExaoneConfig``); the released checkpoints name their class ``ExaoneForCausalLM`` and their
activation ``activation_function``, which is what llama.cpp's converter reads to write an exaone
file (``checkpoint_config``). The EXAONE 3.5 fixture carries its llama3 rope scaling (factor 8, low/
high frequency factors 1/4, base 1e6) with the original context scaled down from 8192 to 64, so the
fixture's 40 positions turn the scaled, the smoothed and the unscaled frequencies alike; the
converter writes the factors as ``rope_freqs``.

The sliding variant has three sliding-window layers (window 8, shorter than the fixture's 40
tokens, so the window matters) before each full-attention layer. It has 64 layers (and a narrow
width to stay small) because llama.cpp turns sliding windows on for exaone4 only in 64-layer
models (the 32B; src/models/exaone4.cpp): with fewer layers it runs every layer global with rope,
unlike transformers, so it could not cross-check a shallower sliding fixture.
"""

from __future__ import annotations

from typing import Any

from archrun.conformance.hf import HfArch, TinyFixture


def _exaone_rope(kw: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 3.5's llama3 rope (``rope_original_context`` given) or EXAONE 3.0's plain one."""
    params = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
    if (original := kw.pop("rope_original_context", None)) is not None:
        params.update(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=original)
    return params


EXAONE = HfArch("exaone", "exaone", "LlamaForCausalLM", "ExaoneConfig", converter="llama.cpp",
                defaults={"num_hidden_layers": 2, "rms_norm_eps": 1e-5},
                rope_parameters=_exaone_rope,
                checkpoint_config=lambda hp: {"architectures": ["ExaoneForCausalLM"],
                                              "activation_function": hp["hidden_act"]})

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

ARCHES = (EXAONE, EXAONE4, EXAONE_MOE)

FIXTURES = (
    # EXAONE 3.5 2.4B-style: tied, llama3 rope over a scaled-down original context, base 1e6
    TinyFixture("exaone3_5_llama3_tied", "exaone", 1, {"tie_word_embeddings": True, "rope_theta": 1_000_000.0,
                                                       "rope_original_context": 64}),
    # EXAONE 3.0 7.8B-style: untied, base 500000, no scaling; 3 layers, 8 heads over 2 KV heads
    TinyFixture("exaone3_gqa_3layer", "exaone", 2, {"rope_theta": 500_000.0, "num_hidden_layers": 3,
                                                    "num_attention_heads": 8, "num_key_value_heads": 2}),
    TinyFixture("exaone4_global", "exaone4", 1),
    TinyFixture("exaone4_sliding_64layer", "exaone4", 2, {
        "num_hidden_layers": 64, "sliding_window": 8, "tie_word_embeddings": True, "hidden_size": 16,
        "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1}),
    TinyFixture("exaone_moe_sliding_shared", "exaone_moe", 1),
)
