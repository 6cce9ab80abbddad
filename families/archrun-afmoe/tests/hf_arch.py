"""archrun-afmoe's tiny fixtures: HF AfmoeForCausalLM, converted by llama.cpp's own converter.

Trinity's settings, scaled down: a global layer every 4 (the others slide, window 8 here), muP
embedding scale on, a leading dense layer, sigmoid routing with a selection bias, renormalised and
scaled (route_scale 2.826, Trinity-Mini's), shared experts, epsilon 1e-5, rope base 10000. The
released config.json carries `score_func` "sigmoid" and `route_norm` true, which transformers 5
drops: `checkpoint_config` adds them back so the converter writes the gating and renormalisation.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

AFMOE = HfArch("afmoe", "afmoe", "AfmoeForCausalLM", "AfmoeConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 4, "num_dense_layers": 1, "head_dim": 16, "intermediate_size": 64,
                         "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
                         "num_shared_experts": 1, "route_scale": 2.826, "global_attn_every_n_layers": 4,
                         "sliding_window": 8, "mup_enabled": True, "rms_norm_eps": 1e-5},
               checkpoint_config=lambda hp: {"score_func": "sigmoid", "route_norm": True})

ARCHES = (AFMOE,)

FIXTURES = (
    TinyFixture("afmoe_sssg_window8", "afmoe", 1),
    TinyFixture("afmoe_mha_top3", "afmoe", 2, {"num_experts_per_tok": 3, "num_key_value_heads": 4,
                                                "num_shared_experts": 2}),
)
