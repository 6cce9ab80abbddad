"""archrun-olmo's tiny fixtures: HF OlmoForCausalLM / Olmo2ForCausalLM, converted by llama.cpp's converter."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

OLMO = HfArch("olmo", "olmo", "OlmoForCausalLM", "OlmoConfig", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "rms_norm_eps": None})
OLMO2 = HfArch("olmo2", "olmo2", "Olmo2ForCausalLM", "Olmo2Config", converter="llama.cpp",
               defaults={"num_hidden_layers": 2})

# llama.cpp's olmoe takes K norms of the full width (no grouped K/V heads) and an RMS epsilon of
# 1e-5 (its converter writes that value): the fixtures match both
OLMOE = HfArch("olmoe", "olmoe", "OlmoeForCausalLM", "OlmoeConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "num_experts": 4,
                         "num_experts_per_tok": 2})

ARCHES = (OLMO, OLMO2, OLMOE)

FIXTURES = (
    TinyFixture("olmo_gqa", "olmo", 1),
    TinyFixture("olmo_mha_tied", "olmo", 2, {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    TinyFixture("olmo_clip_qkv", "olmo", 3, {"clip_qkv": 0.5}),
    TinyFixture("olmo2_gqa", "olmo2", 1),
    TinyFixture("olmo2_3layer_8head", "olmo2", 2, {"num_attention_heads": 8, "num_key_value_heads": 4,
                                                    "num_hidden_layers": 3}),
    TinyFixture("olmoe_4experts", "olmoe", 1),
    TinyFixture("olmoe_8experts_top3", "olmoe", 2, {"num_experts": 8, "num_experts_per_tok": 3, "intermediate_size": 32,
                                                     "num_attention_heads": 8, "num_key_value_heads": 8}),
)
