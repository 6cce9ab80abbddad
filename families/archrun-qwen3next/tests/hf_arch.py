"""archrun-qwen3next's tiny fixtures: HF Qwen3NextForCausalLM converted by llama.cpp's own converter
(which adds 1 to the zero-centred norm weights except the DeltaNet's gated norm, splits in_proj_qkvz
into attn_qkv | attn_gate, writes A = -exp(A_log) and `full_attention_interval`)."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

QWEN3NEXT = HfArch(
    "qwen3next", "qwen3_next", "Qwen3NextForCausalLM", "Qwen3NextConfig", converter="llama.cpp",
    defaults={"num_hidden_layers": 4, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
              "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
              "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
              "shared_expert_intermediate_size": 32, "full_attention_interval": 4},
    norm_init=(0.0, 0.25))

ARCHES = (QWEN3NEXT,)

FIXTURES = (
    # DeltaNet, DeltaNet, DeltaNet, gated attention (the released 3:1 pattern); 2 value heads per key head
    TinyFixture("qwen3next_dddA", "qwen3_next", 1),
    # interval 2 (D A D A), as many value as key heads, 3 conv taps, wider rope
    TinyFixture("qwen3next_dAdA_k3", "qwen3_next", 2, {"full_attention_interval": 2, "linear_num_value_heads": 2,
                                                       "linear_conv_kernel_dim": 3, "partial_rotary_factor": 0.5}),
)
