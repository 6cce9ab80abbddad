"""archrun-qwen35's tiny fixtures: HF Qwen3_5ForCausalLM (text) converted by llama.cpp's own
converter (value heads reordered to tiled order; norms +1 but the DeltaNet's gated norm)."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture, default_rope_parameters


def _rope(kw):
    """transformers' rope_parameters with an interleaved-MRoPE section that fits the tiny rotary width."""
    sections = kw.pop("mrope_section")
    return {**default_rope_parameters(kw), "mrope_section": sections, "mrope_interleaved": True}


QWEN35 = HfArch(
    "qwen35", "qwen3_5_text", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", converter="llama.cpp",
    rope_parameters=_rope,
    defaults={"num_hidden_layers": 4, "head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1], "linear_conv_kernel_dim": 4,
              "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
              "linear_num_value_heads": 4, "full_attention_interval": 4},
    norm_init=(0.0, 0.25))

QWEN35MOE = HfArch(
    "qwen35moe", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", converter="llama.cpp",
    rope_parameters=_rope,
    defaults={**QWEN35.defaults, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
              "shared_expert_intermediate_size": 32},
    norm_init=(0.0, 0.25))

ARCHES = (QWEN35, QWEN35MOE)

FIXTURES = (
    # DeltaNet x3, gated attention; two value heads per key head (the tiled reorder matters)
    TinyFixture("qwen35_dddA", "qwen3_5_text", 1),
    # interval 2, three value heads on one key head, 3 taps, tied head
    TinyFixture("qwen35_dAdA_tied", "qwen3_5_text", 2, {"full_attention_interval": 2, "linear_num_key_heads": 1,
                                                        "linear_num_value_heads": 3, "linear_conv_kernel_dim": 3,
                                                        "tie_word_embeddings": True}),
    # the mixture of experts variant: top-2 of 4 experts plus a gated shared expert on every layer
    TinyFixture("qwen35moe_ddAd", "qwen3_5_moe_text", 3, {"full_attention_interval": 3}),
)
