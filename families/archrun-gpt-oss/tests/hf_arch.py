"""archrun-gpt-oss's tiny fixtures: HF GptOssForCausalLM, converted by llama.cpp's own converter
(float32 experts: the converter writes MXFP4 only for checkpoints that ship it).

Tiny models keep transformers' swiglu_alpha/limit (1.702 / 7): llama.cpp fixes both.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

GPT_OSS = HfArch("gpt-oss", "gpt_oss", "GptOssForCausalLM", "GptOssConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 4, "hidden_size": 48, "head_dim": 16, "num_attention_heads": 4,
                           "num_key_value_heads": 2,
                           "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 24,
                           "sliding_window": 6, "layer_types": None})

ARCHES = (GPT_OSS,)

FIXTURES = (
    # sinks, alternating 6-token window, biased experts and router, GQA
    TinyFixture("gpt_oss_gqa_window6", "gpt_oss", 1),
    # wider window, MHA, top-3 of 4 experts
    TinyFixture("gpt_oss_mha_top3", "gpt_oss", 2, {"num_key_value_heads": 4, "num_local_experts": 4,
                                                   "num_experts_per_tok": 3, "sliding_window": 12}),
    # widths that are multiples of 32, so the experts can be MXFP4 blocks (test_gpt_oss_mxfp4.py)
    TinyFixture("gpt_oss_mxfp4_widths", "gpt_oss", 3, {"hidden_size": 64, "intermediate_size": 32,
                                                       "num_hidden_layers": 2, "num_local_experts": 4}),
)
