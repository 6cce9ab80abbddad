"""archrun-exaone's tiny fixtures: HF Exaone4ForCausalLM, converted by llama.cpp's own converter.

The sliding variant has three sliding-window layers (window 8, shorter than the fixture's 40
tokens, so the window matters) before each full-attention layer. It has 64 layers (and a narrow
width to stay small) because llama.cpp turns sliding windows on for exaone4 only in 64-layer
models (the 32B; src/models/exaone4.cpp): with fewer layers it runs every layer global with rope,
unlike transformers, so it could not cross-check a shallower sliding fixture.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

EXAONE4 = HfArch("exaone4", "exaone4", "Exaone4ForCausalLM", "Exaone4Config", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2})

ARCHES = (EXAONE4,)

FIXTURES = (
    TinyFixture("exaone4_global", "exaone4", 1),
    TinyFixture("exaone4_sliding_64layer", "exaone4", 2, {
        "num_hidden_layers": 64, "sliding_window": 8, "tie_word_embeddings": True, "hidden_size": 16,
        "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1}),
)
