"""archrun-lfm2's tiny fixtures: HF Lfm2ForCausalLM converted by llama.cpp's own converter, which
writes `attention.head_count_kv` per layer (0 on the short-convolution layers).

The FFN width is taken as given (`block_auto_adjust_ff_dim` off: the auto rule rounds to 256).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _layers(kinds: str) -> dict:
    """layer_types from a string of c (conv) / a (attention)."""
    return {"layer_types": ["conv" if k == "c" else "full_attention" for k in kinds], "num_hidden_layers": len(kinds)}


LFM2 = HfArch("lfm2", "lfm2", "Lfm2ForCausalLM", "Lfm2Config", converter="llama.cpp",
              defaults={"block_auto_adjust_ff_dim": False, "norm_eps": 1e-5, "conv_L_cache": 3,
                        **_layers("ccac")})

# LFM2-MoE's converter writes the RMS epsilon from `rms_norm_eps` (the tiny defaults' 1e-6), not
# `norm_eps` as LFM2's does: the fixture gives both the same value.
LFM2MOE = HfArch("lfm2moe", "lfm2_moe", "Lfm2MoeForCausalLM", "Lfm2MoeConfig", converter="llama.cpp",
                 defaults={"norm_eps": 1e-6, "conv_L_cache": 3, "num_dense_layers": 1, "num_experts": 4,
                           "num_experts_per_tok": 2, "moe_intermediate_size": 16, "tie_word_embeddings": True,
                           **_layers("ccac")})

ARCHES = (LFM2, LFM2MOE)

FIXTURES = (
    # conv, conv, attention, conv (the released models' pattern, shortened); 3 taps
    TinyFixture("lfm2_ccac", "lfm2", 1),
    # attention first, a 4-tap convolution, tied head, one kv head
    TinyFixture("lfm2_acca_l4", "lfm2", 2, {"conv_L_cache": 4, "tie_word_embeddings": True,
                                            "num_key_value_heads": 1, **_layers("acca")}),
    # conv only past the first layer, wider FFN, 2-tap convolution
    TinyFixture("lfm2_accc_l2", "lfm2", 3, {"conv_L_cache": 2, "intermediate_size": 96, **_layers("accc")}),
    # LFM2-MoE: a dense first layer, then sigmoid-routed experts with a selection bias
    TinyFixture("lfm2moe_ccac", "lfm2_moe", 5),
)
