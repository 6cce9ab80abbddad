"""archrun-ernie's tiny fixtures: HF Ernie4_5ForCausalLM, converted by llama.cpp's own converter.

Ernie4_5Config's default head_dim is 128; the fixtures set a tiny one (written as
attention.key_length/value_length). llama.cpp's ernie4_5 loader takes no bias tensors
(`use_bias = true` files do not load there; released checkpoints have none), so no fixture has them.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

ERNIE4_5 = HfArch("ernie4_5", "ernie4_5", "Ernie4_5ForCausalLM", "Ernie4_5Config", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "head_dim": 16, "pad_token_id": 0})

ARCHES = (ERNIE4_5,)

FIXTURES = (
    TinyFixture("ernie4_5_gqa", "ernie4_5", 1),
    TinyFixture("ernie4_5_tied_hd8", "ernie4_5", 2,
                {"tie_word_embeddings": True, "num_attention_heads": 8, "head_dim": 8,
                 "num_hidden_layers": 3}),
)
