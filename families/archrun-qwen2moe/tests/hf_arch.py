"""archrun-qwen2moe's tiny fixtures: HF Qwen2MoeForCausalLM, converted by llama.cpp's own converter."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

QWEN2MOE = HfArch("qwen2moe", "qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2,
                            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                            "decoder_sparse_step": 1})

ARCHES = (QWEN2MOE,)

FIXTURES = (
    TinyFixture("qwen2moe_4experts", "qwen2_moe", 1),
    TinyFixture("qwen2moe_8experts_3layer", "qwen2_moe", 2, {
        "num_experts": 8, "num_experts_per_tok": 3, "shared_expert_intermediate_size": 32, "num_hidden_layers": 3}),
)
