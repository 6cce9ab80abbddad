"""archrun-apertus's tiny fixtures: HF ApertusForCausalLM, converted by llama.cpp's own converter.

The fixtures carry Apertus-8B/70B's settings: llama3 rope scaling (factor 8, low/high frequency
factors 1/4, base 12e6) with the original context scaled down from 8192 to 64 so the fixtures' 40
positions turn the scaled, smoothed and unscaled frequencies alike; per-head Q/K norms; the xIELU
FFN. Each layer's xIELU parameters are drawn apart (raw alpha_p around softplus^-1(0.8), alpha_n
around softplus^-1(0.3), beta around 0.5; eps -1e-6 as released), so a layer reading another's
values, or a missing softplus, moves the logits.
"""

from __future__ import annotations

from typing import Any

from archrun.conformance.hf import HfArch, TinyFixture


def _llama3_rope(kw: dict[str, Any]) -> dict[str, Any]:
    return {"rope_type": "llama3", "rope_theta": kw.pop("rope_theta"), "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": kw.pop("rope_original_context", 64)}


APERTUS = HfArch("apertus", "apertus", "ApertusForCausalLM", "ApertusConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2, "rms_norm_eps": 1e-5, "hidden_act": "xielu",
                           "rope_theta": 12_000_000.0, "max_position_embeddings": 65536},
                 rope_parameters=_llama3_rope,
                 scalar_init={"act_fn.alpha_p": (0.2, 0.5), "act_fn.alpha_n": (-1.0, 0.5),
                              "act_fn.beta": (0.5, 0.15), "act_fn.eps": (-1e-6, 0.0)})

ARCHES = (APERTUS,)

FIXTURES = (
    TinyFixture("apertus_gqa_llama3", "apertus", 1),
    # 3 layers, 8 heads over 2 KV heads, a wider FFN (untied: llama.cpp's apertus requires output.weight)
    TinyFixture("apertus_3layer_8head", "apertus", 2, {"num_hidden_layers": 3, "num_attention_heads": 8,
                                                       "num_key_value_heads": 2, "intermediate_size": 96}),
)
