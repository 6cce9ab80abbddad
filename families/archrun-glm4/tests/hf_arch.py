"""archrun-glm4's tiny fixtures: HF Glm4ForCausalLM, converted by llama.cpp's own converter.

Glm4Config's default pad_token_id (151329) is outside the tiny vocabulary and its default
head_dim is 128: the fixtures set tiny ones. llama.cpp's converter writes
rope.dimension_count = partial_rotary_factor * head_dim.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

GLM4 = HfArch("glm4", "glm4", "Glm4ForCausalLM", "Glm4Config", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "pad_token_id": 0, "head_dim": 16, "partial_rotary_factor": 0.5})

ARCHES = (GLM4,)

FIXTURES = (
    TinyFixture("glm4_bias_rot50", "glm4", 1),
    TinyFixture("glm4_nobias_rot25_tied_hd32", "glm4", 2,
                {"attention_bias": False, "partial_rotary_factor": 0.25, "tie_word_embeddings": True,
                 "head_dim": 32, "num_hidden_layers": 3}),
)
