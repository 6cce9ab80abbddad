"""archrun-phi's tiny fixtures: HF PhiForCausalLM (phi2) and Phi3ForCausalLM (phi3), converted by
llama.cpp's own converter.

phi2: llama.cpp's converter writes feed_forward_length = 4 * hidden_size and
head_count_kv = head_count (phi2 has no GQA), so the fixtures use exactly those.
phi3: Phi3Config's default pad_token_id (32000) is outside the tiny vocabulary, so the fixtures
set one inside it. The converter reads rope.scaling.original_context_length from
`original_max_position_embeddings` and, for LongRoPE, writes the long/short factor tensors and
rope.scaling.attn_factor = sqrt(1 + ln(max_pos / original) / ln(original)). The longrope fixture
has original_max_position_embeddings (16) below its 40 tokens, so HF (which picks the factors by
sequence length) uses the long factors, as llama.cpp and archrun do for a context beyond it.
The phi3 fixtures' names avoid "phi3" and "phi-3": llama.cpp sets per-token attributes on Phi-3's
own special tokens ("</s>", "<unk>", ...) for any model whose general.name contains either,
and fails to load a file whose vocabulary lacks them (the tiny one does).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture, default_rope_parameters


def _phi3_rope(kw):
    """transformers' rope_parameters of a phi3 fixture: default, or longrope with the flat factor lists."""
    long_factor = kw.pop("long_factor", None)
    short_factor = kw.pop("short_factor", None)
    params = default_rope_parameters(kw)
    if long_factor is not None:
        params.update(rope_type="longrope", long_factor=long_factor, short_factor=short_factor,
                      original_max_position_embeddings=kw["original_max_position_embeddings"])
    return params


PHI2 = HfArch("phi2", "phi", "PhiForCausalLM", "PhiConfig", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "layer_norm_eps": 1e-5, "intermediate_size": 256,
                        "num_key_value_heads": 4, "partial_rotary_factor": 0.5})
PHI3 = HfArch("phi3", "phi3", "Phi3ForCausalLM", "Phi3Config", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "pad_token_id": 0, "original_max_position_embeddings": 256},
              rope_parameters=_phi3_rope)

ARCHES = (PHI2, PHI3)

LONG = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0]

FIXTURES = (
    TinyFixture("phi2_rot50", "phi2", 1),
    TinyFixture("phi2_rot75_8head", "phi2", 2, {"partial_rotary_factor": 0.75, "num_attention_heads": 8,
                                                "num_key_value_heads": 8}),
    TinyFixture("phi_3_gqa", "phi3", 1),
    TinyFixture("phi_3_rot50_tied_mha", "phi3", 2,
                {"partial_rotary_factor": 0.5, "tie_word_embeddings": True, "num_key_value_heads": 4}),
    TinyFixture("phi_3_longrope", "phi3", 3,
                {"original_max_position_embeddings": 16, "long_factor": LONG, "short_factor": SHORT}),
)
