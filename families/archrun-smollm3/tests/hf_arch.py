"""archrun-smollm3's tiny fixtures: HF SmolLM3ForCausalLM, converted by llama.cpp's own converter.

Four layers, so layer 3 is a NoPE layer. SmolLM3Config's default pad_token_id (128004) is outside
the tiny vocabulary, so the fixtures set one inside it.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

SMOLLM3 = HfArch("smollm3", "smollm3", "SmolLM3ForCausalLM", "SmolLM3Config", converter="llama.cpp",
                 defaults={"num_hidden_layers": 4, "pad_token_id": 0})

ARCHES = (SMOLLM3,)

FIXTURES = (
    TinyFixture("smollm3_gqa", "smollm3", 1),
    TinyFixture("smollm3_tied_mha_theta", "smollm3", 2,
                {"tie_word_embeddings": True, "num_attention_heads": 8, "num_key_value_heads": 8,
                 "rope_theta": 500.0}),
)
