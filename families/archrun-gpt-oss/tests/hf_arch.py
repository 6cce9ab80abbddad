"""archrun-gpt-oss's tiny fixtures: HF GptOssForCausalLM, converted by llama.cpp's own converter
(float32 experts: the converter writes MXFP4 only for checkpoints that ship it).

Tiny models keep transformers' swiglu_alpha/limit (1.702 / 7): llama.cpp fixes both. They keep the
released checkpoints' rope too (GptOssConfig's defaults): YaRN factor 32 over an original context of
4096, beta 32/1, correction dims not rounded (`truncate: false`), base 150000, head width 64, on
every layer, sliding or full. At these widths YaRN interpolates the slow half of the rotated dims and its
attention factor (1 + 0.1 ln 32 = 1.35 on cos and sin) scales every layer's scores by 1.81: with the
rope of either layer kind plain, the logits move by ~1e-1 of their range (the kit's
`test_fixture_sees_rope_scaling`), and rounding the correction dims moves them by more than the
tolerance too.
"""

from __future__ import annotations

from typing import Any

from archrun.conformance.hf import HfArch, TinyFixture


def _yarn(kw: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss's released rope (GptOssConfig's default rope_parameters) with the fixture's base."""
    return {"rope_type": "yarn", "rope_theta": kw.pop("rope_theta"), "factor": kw.pop("rope_factor", 32.0),
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": kw.pop("rope_original_context", 4096)}


GPT_OSS = HfArch("gpt-oss", "gpt_oss", "GptOssForCausalLM", "GptOssConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 4, "hidden_size": 48, "head_dim": 64, "num_attention_heads": 2,
                           "num_key_value_heads": 1,
                           "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 24,
                           "sliding_window": 6, "layer_types": None,
                           "rope_theta": 150000.0, "max_position_embeddings": 131072},
                 rope_parameters=_yarn)

ARCHES = (GPT_OSS,)

FIXTURES = (
    # sinks, alternating 6-token window, biased experts and router, GQA
    TinyFixture("gpt_oss_gqa_window6", "gpt_oss", 1),
    # wider window, MHA, top-3 of 4 experts
    TinyFixture("gpt_oss_mha_top3", "gpt_oss", 2, {"hidden_size": 32, "num_attention_heads": 4,
                                                   "num_key_value_heads": 4, "num_local_experts": 4,
                                                   "num_experts_per_tok": 3, "sliding_window": 12}),
    # widths that are multiples of 32, so the experts can be MXFP4 blocks (test_gpt_oss_mxfp4.py)
    TinyFixture("gpt_oss_mxfp4_widths", "gpt_oss", 3, {"hidden_size": 64, "intermediate_size": 32,
                                                       "num_hidden_layers": 2, "num_local_experts": 4,
                                                       "num_attention_heads": 4, "num_key_value_heads": 2}),
)
