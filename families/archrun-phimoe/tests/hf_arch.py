"""archrun-phimoe's tiny fixtures: HF PhimoeForCausalLM, converted by llama.cpp's own converter.

The released Phi-3.5-MoE's settings, scaled down: LongRoPE over original_max_position_embeddings
4096 extended to 131072 with short_mscale = long_mscale 1.243163121016122, rope base 10000,
attention and lm_head biases, epsilon 1e-5, router_jitter_noise 0.01, top-2 routing, sliding
window 131072 (never reached). The fixtures' 40 positions are below 4096, where HF's rotary
embedding divides by the short factors and scales cos/sin by short_mscale. llama.cpp is not a
reference here: its phimoe graph (src/models/phi3.cpp) runs RMSNorm where PhiMoE has LayerNorm and
routes by softmax top-k renormalised where PhiMoE has sparsemixer.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture, default_rope_parameters

SHORT_MSCALE = 1.243163121016122
ORIGINAL_CONTEXT = 4096
SHORT = [1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 4.5]   # n_rot/2 = 8 (head width 16)
LONG = [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0]
LLAMA_CPP = ("llama.cpp's phimoe graph runs RMSNorm (+ bias) for PhiMoE's LayerNorms and softmax top-k "
             "renormalised routing for its sparsemixer")


def _longrope(kw):
    """transformers' rope_parameters of a phimoe fixture: Phi-3.5-MoE's LongRoPE with its mscales."""
    params = default_rope_parameters(kw)
    params.update(rope_type="longrope", short_factor=kw.pop("short_factor", SHORT),
                  long_factor=kw.pop("long_factor", LONG), short_mscale=SHORT_MSCALE, long_mscale=SHORT_MSCALE,
                  original_max_position_embeddings=ORIGINAL_CONTEXT)
    return params


PHIMOE = HfArch("phimoe", "phimoe", "PhimoeForCausalLM", "PhimoeConfig", converter="llama.cpp",
                defaults={"num_hidden_layers": 2, "intermediate_size": 32, "rms_norm_eps": 1e-5,
                          "max_position_embeddings": 131072, "sliding_window": 131072, "num_local_experts": 4,
                          "num_experts_per_tok": 2, "router_jitter_noise": 0.01, "attention_bias": True,
                          "lm_head_bias": True, "pad_token_id": 0},
                rope_parameters=_longrope,
                # the released config.json's class name, which llama.cpp's converter registers
                checkpoint_config=lambda hp: {"architectures": ["PhiMoEForCausalLM"]})

ARCHES = (PHIMOE,)

FIXTURES = (
    TinyFixture("phimoe_4experts_bias", "phimoe", 1, llama_cpp=LLAMA_CPP),
    TinyFixture("phimoe_8experts_mha", "phimoe", 2, {"num_local_experts": 8, "num_attention_heads": 8,
                                                     "num_key_value_heads": 8, "attention_bias": False,
                                                     "lm_head_bias": False, "short_factor": SHORT[::2],
                                                     "long_factor": LONG[::2]},
                llama_cpp=LLAMA_CPP + "; its phimoe loader requires the attention and output biases"),
)
