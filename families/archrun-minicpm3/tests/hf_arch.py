"""archrun-minicpm3's tiny fixtures: HF MiniCPM3ForCausalLM, converted by llama.cpp's own converter.

MiniCPM3-4B's settings, scaled down: scale_emb 12, scale_depth 1.4, dim_model_base 256 (the values
llama.cpp's graph hard-codes; its converter writes none of them), LongRoPE whose original context
equals the maximum (32768: the short factors, magnitude 1), epsilon 1e-5, a q LoRA, MLA with the
unsplit kv_b projection, NEOX rope on the rope dims.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture, default_rope_parameters

SHORT = [1.0, 1.1, 1.3, 1.6]   # qk_rope_head_dim 8 -> 4 factors
LONG = [1.0, 2.0, 4.0, 8.0]


def _longrope(kw):
    params = default_rope_parameters(kw)
    params.update(rope_type="longrope", short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=32768)
    return params


MINICPM3 = HfArch("minicpm3", "minicpm3", "MiniCPM3ForCausalLM", "MiniCPM3Config", converter="llama.cpp",
                  defaults={"num_hidden_layers": 2, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
                            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "scale_emb": 12, "scale_depth": 1.4,
                            "dim_model_base": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5},
                  rope_parameters=_longrope)

ARCHES = (MINICPM3,)

FIXTURES = (
    TinyFixture("minicpm3_qlora", "minicpm3", 1),
    TinyFixture("minicpm3_3layer_8head", "minicpm3", 2, {"num_hidden_layers": 3, "num_attention_heads": 8,
                                                          "num_key_value_heads": 8}),
)
