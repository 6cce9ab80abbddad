"""archrun-jamba's tiny fixtures: HF JambaForCausalLM converted by llama.cpp's own converter (which
writes `head_count_kv` per layer from attn_layer_period/offset, A = -exp(A_log), stacked experts)."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

JAMBA = HfArch(
    "jamba", "jamba", "JambaForCausalLM", "JambaConfig", converter="llama.cpp",
    defaults={"num_hidden_layers": 4, "num_experts": 4, "num_experts_per_tok": 2, "expert_layer_period": 2,
              "expert_layer_offset": 1, "attn_layer_period": 4, "attn_layer_offset": 2, "mamba_d_state": 16,
              "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8, "use_mamba_kernels": False,
              "intermediate_size": 32})

ARCHES = (JAMBA,)

FIXTURES = (
    # Mamba, Mamba+MoE, attention, Mamba+MoE
    TinyFixture("jamba_mmam_moe2", "jamba", 1),
    # attention first, MoE on every layer, 3 conv taps, a narrower dt rank
    TinyFixture("jamba_ammm_k3", "jamba", 2, {"attn_layer_offset": 0, "expert_layer_period": 1,
                                              "expert_layer_offset": 0, "mamba_d_conv": 3, "mamba_dt_rank": 4}),
)
