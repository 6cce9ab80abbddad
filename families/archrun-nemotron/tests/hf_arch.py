"""archrun-nemotron's tiny fixtures: HF NemotronForCausalLM, converted by llama.cpp's own converter.

llama.cpp's converter adds 1 to every `*norm.weight` (LayerNorm1P) and writes
rope.dimension_count = partial_rotary_factor * head_dim. llama.cpp's nemotron loader requires
`output.weight` (tied embeddings do not load there), so the fixtures are untied.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

NEMOTRON = HfArch("nemotron", "nemotron", "NemotronForCausalLM", "NemotronConfig", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "norm_eps": 1e-5, "partial_rotary_factor": 0.5,
                            "intermediate_size": 128},
                  norm_init=(0.0, 0.25))  # HF LayerNorm1P weights are offsets from 1

ARCHES = (NEMOTRON,)

FIXTURES = (
    TinyFixture("nemotron_rot50_gqa", "nemotron", 1),
    TinyFixture("nemotron_rot25_bias_mha", "nemotron", 2,
                {"partial_rotary_factor": 0.25, "attention_bias": True, "mlp_bias": True, "num_key_value_heads": 4,
                 "num_hidden_layers": 3}),
)
