"""archrun-arcee's tiny fixtures: HF ArceeForCausalLM, converted by llama.cpp's own converter.

llama.cpp's arcee loader takes no bias tensors (attention_bias / mlp_bias files do not load
there; released checkpoints have none), so no fixture has them.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

ARCEE = HfArch("arcee", "arcee", "ArceeForCausalLM", "ArceeConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "intermediate_size": 128})

ARCHES = (ARCEE,)

FIXTURES = (
    TinyFixture("arcee_gqa", "arcee", 1),
    TinyFixture("arcee_tied_mha", "arcee", 2,
                {"tie_word_embeddings": True, "num_attention_heads": 8,
                 "num_key_value_heads": 8, "num_hidden_layers": 3}),
)
