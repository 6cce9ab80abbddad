"""archrun-seed-oss's tiny fixtures: HF SeedOssForCausalLM, converted by llama.cpp's own converter.

SeedOssConfig's default head_dim is 128: the fixtures set tiny ones. llama.cpp's seed_oss loader
takes no output-projection bias (attention_out_bias = true files do not load there), so no
fixture has one.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

SEED_OSS = HfArch("seed_oss", "seed_oss", "SeedOssForCausalLM", "SeedOssConfig", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "head_dim": 16})

ARCHES = (SEED_OSS,)

FIXTURES = (
    TinyFixture("seed_oss_qkv_bias_gqa", "seed_oss", 1),
    TinyFixture("seed_oss_nobias_tied_hd8", "seed_oss", 2,
                {"attention_bias": False, "tie_word_embeddings": True, "num_attention_heads": 8, "head_dim": 8,
                 "num_hidden_layers": 3}),
)
