"""archrun-jais2's tiny fixtures: HF Jais2ForCausalLM, converted by llama.cpp's own converter.

Jais-2-8B's settings, scaled down: multi-head attention (no grouped K/V heads), every projection
biased, LayerNorms with biases, a plain squared-ReLU FFN, the default rope.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

JAIS2 = HfArch("jais2", "jais2", "Jais2ForCausalLM", "Jais2Config", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "num_key_value_heads": 4, "rms_norm_eps": None,
                         "layer_norm_eps": 1e-5, "intermediate_size": 128})

ARCHES = (JAIS2,)

FIXTURES = (
    TinyFixture("jais2_mha_bias", "jais2", 1),
    # 3 layers, 8 heads over 2 KV heads, another rope base
    TinyFixture("jais2_gqa_3layer", "jais2", 2, {"num_hidden_layers": 3, "num_attention_heads": 8,
                                                 "num_key_value_heads": 2, "rope_theta": 500000.0}),
)
