"""archrun-gpt2's tiny fixtures: HF GPT2LMHeadModel, converted by llama.cpp's own converter.

GPT-2 checkpoints carry `n_ctx` in config.json, which llama.cpp's converter reads as the context
length (transformers' GPT2Config no longer writes it): the fixtures set it as the real files do.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

GPT2 = HfArch("gpt2", "gpt2", "GPT2LMHeadModel", "GPT2Config", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "n_ctx": 256, "n_positions": 256, "layer_norm_epsilon": 1e-5})

ARCHES = (GPT2,)

FIXTURES = (
    TinyFixture("gpt2_tied", "gpt2", 1, {"tie_word_embeddings": True}),
    TinyFixture("gpt2_untied_8head", "gpt2", 2, {"tie_word_embeddings": False, "num_attention_heads": 8,
                                                   "num_hidden_layers": 3}),
)
