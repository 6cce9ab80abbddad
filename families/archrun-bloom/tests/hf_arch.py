"""archrun-bloom's tiny fixtures: HF BloomForCausalLM, converted by llama.cpp's own converter.

BLOOM's configs name their LayerNorm epsilon `layer_norm_epsilon` and carry no RMS epsilon, so the
fixtures drop the tiny defaults' `rms_norm_eps`. BLOOM ties its head to the embeddings.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

BLOOM = HfArch("bloom", "bloom", "BloomForCausalLM", "BloomConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "layer_norm_epsilon": 1e-5, "rms_norm_eps": None,
                         "tie_word_embeddings": True, "num_key_value_heads": None})

ARCHES = (BLOOM,)

FIXTURES = (
    TinyFixture("bloom_4head", "bloom", 1),
    TinyFixture("bloom_8head_3layer", "bloom", 2, {"num_attention_heads": 8, "num_hidden_layers": 3}),
)
