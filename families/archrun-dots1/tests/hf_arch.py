"""archrun-dots1's tiny fixtures: HF Dots1ForCausalLM, converted by llama.cpp's own converter.

llama.cpp's dots1 has no grouped K/V heads: the fixtures give K/V as many heads as Q. Its
converter writes no `expert_gating_func` and llama.cpp's dots1 graph then aborts (gating type 0):
the llama.cpp cross-check adds the sigmoid gating (2) that HF's Dots1 router computes.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

DOTS1 = HfArch("dots1", "dots1", "Dots1ForCausalLM", "Dots1Config", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "head_dim": 16, "num_key_value_heads": 4, "n_routed_experts": 4,
                         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                         "first_k_dense_replace": 1},
               llamacpp_keys={"expert_gating_func": 2})

ARCHES = (DOTS1,)

FIXTURES = (
    TinyFixture("dots1_dense_first", "dots1", 1),
    TinyFixture("dots1_8experts_scaled", "dots1", 2, {"n_routed_experts": 8, "num_experts_per_tok": 3,
                                                       "routed_scaling_factor": 2.5, "num_hidden_layers": 3}),
)
