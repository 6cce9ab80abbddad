"""archrun-llama4's tiny fixtures: HF Llama4ForCausalLM (text), converted by llama.cpp's own converter.

llama.cpp fixes the chunk at 8192 tokens and the temperature tuning at (0.1, 8192), so on 40-token
fixtures neither shows (HF's defaults are the same); archrun-llama4-ops' own tests check both
against hand-written math. What the fixtures do show: NoPE global layers, L2-normalised q/k,
input-weighted sigmoid top-1 experts with a shared expert, dense layers between MoE layers.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

LLAMA4 = HfArch("llama4", "llama4_text", "Llama4ForCausalLM", "Llama4TextConfig", converter="llama.cpp",
                defaults={"num_hidden_layers": 4, "hidden_size": 48, "head_dim": 16, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "intermediate_size": 24, "intermediate_size_mlp": 40,
                          "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                          "moe_layers": None, "no_rope_layers": None, "layer_types": None})

ARCHES = (LLAMA4,)

FIXTURES = (
    # MoE every 2nd layer, the 4th layer global without rope
    TinyFixture("llama4_interleaved", "llama4_text", 1),
    # every layer MoE, top-2, 8 layers (two NoPE layers), MHA
    TinyFixture("llama4_all_moe_top2", "llama4_text", 2, {"interleave_moe_layer_step": 1, "num_experts_per_tok": 2,
                                                          "num_hidden_layers": 8, "num_key_value_heads": 4,
                                                          "hidden_size": 32, "intermediate_size": 16}),
)
