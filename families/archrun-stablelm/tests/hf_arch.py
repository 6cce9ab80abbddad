"""archrun-stablelm's tiny fixtures: HF StableLmForCausalLM, converted by llama.cpp's own converter.

llama.cpp's converter writes rope.dimension_count = partial_rotary_factor * head_dim and the
LayerNorm epsilon from `layer_norm_eps`. llama.cpp's stablelm loader requires `output.weight`
(tied embeddings do not load there), so the fixtures are untied, as StableLM checkpoints are.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

STABLELM = HfArch("stablelm", "stablelm", "StableLmForCausalLM", "StableLmConfig", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "layer_norm_eps": 1e-5, "use_parallel_residual": False,
                            "partial_rotary_factor": 0.25})

ARCHES = (STABLELM,)

FIXTURES = (
    TinyFixture("stablelm_qkv_bias_rot25", "stablelm", 1, {"use_qkv_bias": True}),
    TinyFixture("stablelm_rot50_mha_3layer", "stablelm", 2,
                {"partial_rotary_factor": 0.5, "num_hidden_layers": 3, "num_attention_heads": 8,
                 "num_key_value_heads": 8}),
    # parallel blocks (StableLM-2-12B style): one LayerNorm feeds attention and MLP, as the file's
    # use_parallel_residual key says
    TinyFixture("stablelm_parallel", "stablelm", 3, {"use_parallel_residual": True}),
)
