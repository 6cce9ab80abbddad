"""archrun-starcoder2's tiny fixtures: HF Starcoder2ForCausalLM, converted by llama.cpp's own converter.

llama.cpp's starcoder2 loader requires every bias tensor (use_bias = false files do not load
there; released checkpoints have them), so every fixture has them.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

STARCODER2 = HfArch("starcoder2", "starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config", converter="llama.cpp",
                    defaults={"num_hidden_layers": 2, "norm_epsilon": 1e-5, "intermediate_size": 128})

ARCHES = (STARCODER2,)

FIXTURES = (
    TinyFixture("starcoder2_bias_gqa", "starcoder2", 1),
    TinyFixture("starcoder2_bias_tied_8head", "starcoder2", 2,
                {"tie_word_embeddings": True, "num_attention_heads": 8, "num_hidden_layers": 3}),
)
