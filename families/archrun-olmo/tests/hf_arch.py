"""archrun-olmo's tiny fixtures: HF OlmoForCausalLM / Olmo2ForCausalLM / Olmo3ForCausalLM / OlmoeForCausalLM,
converted by llama.cpp's converter.

OLMo 3 converts to olmo2 (llama.cpp's converter writes its window and per-layer pattern). Its
fixtures carry the released 7B/32B Instruct and Think models' rope: YaRN x8 over an original context
of 8192 with attention factor 1.2079 (0.1 ln 8 + 1), base 500000, on the full-attention layers only;
the sliding layers (three of every four) rotate plain. The window (8) is shorter than the fixtures'
40 tokens so it matters, and the YaRN attention factor scales the full layers' scores by 1.46.
"""

from __future__ import annotations

from typing import Any

from archrun.conformance.hf import HfArch, TinyFixture

OLMO = HfArch("olmo", "olmo", "OlmoForCausalLM", "OlmoConfig", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "rms_norm_eps": None})
OLMO2 = HfArch("olmo2", "olmo2", "Olmo2ForCausalLM", "Olmo2Config", converter="llama.cpp",
               defaults={"num_hidden_layers": 2})

# llama.cpp's olmoe takes K norms of the full width (no grouped K/V heads) and an RMS epsilon of
# 1e-5 (its converter writes that value): the fixtures match both
OLMOE = HfArch("olmoe", "olmoe", "OlmoeForCausalLM", "OlmoeConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "num_experts": 4,
                         "num_experts_per_tok": 2})


def _olmo3_rope(kw: dict[str, Any]) -> dict[str, Any]:
    """OLMo 3's rope_parameters: the released YaRN on the full layers (unless the fixture says
    ``rope_yarn=False``), the default rope on the sliding ones, one base."""
    theta = kw.pop("rope_theta")
    full = {"rope_type": "default"}
    if kw.pop("rope_yarn", True):
        full = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                "attention_factor": 1.2079441541679836, "beta_fast": 32.0, "beta_slow": 1.0}
    return {"full_attention": {**full, "rope_theta": theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": theta}}


OLMO3 = HfArch("olmo2", "olmo3", "Olmo3ForCausalLM", "Olmo3Config", converter="llama.cpp",
               defaults={"num_hidden_layers": 4, "sliding_window": 8, "rope_theta": 500000.0,
                         "max_position_embeddings": 65536},
               rope_parameters=_olmo3_rope)

ARCHES = (OLMO, OLMO2, OLMO3, OLMOE)

FIXTURES = (
    TinyFixture("olmo_gqa", "olmo", 1),
    TinyFixture("olmo_mha_tied", "olmo", 2, {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    TinyFixture("olmo_clip_qkv", "olmo", 3, {"clip_qkv": 0.5}),
    TinyFixture("olmo2_gqa", "olmo2", 1),
    TinyFixture("olmo2_3layer_8head", "olmo2", 2, {"num_attention_heads": 8, "num_key_value_heads": 4,
                                                    "num_hidden_layers": 3}),
    # the default layer pattern (every 4th layer full), GQA
    TinyFixture("olmo3_sssf_yarn8", "olmo3", 1),
    # a stated pattern with two full layers, MHA, 8 heads
    TinyFixture("olmo3_ssfsf_8head", "olmo3", 2, {
        "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 8,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                        "full_attention"]}),
    TinyFixture("olmoe_4experts", "olmoe", 1),
    TinyFixture("olmoe_8experts_top3", "olmoe", 2, {"num_experts": 8, "num_experts_per_tok": 3, "intermediate_size": 32,
                                                     "num_attention_heads": 8, "num_key_value_heads": 8}),
)
