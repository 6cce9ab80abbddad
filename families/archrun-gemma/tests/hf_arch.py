"""archrun-gemma's tiny fixtures: HF GemmaForCausalLM / Gemma2ForCausalLM, converted by llama.cpp's converter.

Gemma ties its head (llama.cpp's converter drops lm_head). llama.cpp scales gemma2's scores by
1/sqrt(head_dim) except in the 27B model (src/models/gemma2-iswa.cpp), while transformers uses
`query_pre_attn_scalar`: the fixtures set it to head_dim, as the smaller released models do.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

GEMMA = HfArch("gemma", "gemma", "GemmaForCausalLM", "GemmaConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2, "head_dim": 16, "tie_word_embeddings": True})
GEMMA2 = HfArch("gemma2", "gemma2", "Gemma2ForCausalLM", "Gemma2Config", converter="llama.cpp",
                defaults={"num_hidden_layers": 4, "head_dim": 16, "tie_word_embeddings": True, "sliding_window": 8,
                          "query_pre_attn_scalar": 16})

ARCHES = (GEMMA, GEMMA2)

FIXTURES = (
    TinyFixture("gemma_gqa", "gemma", 1),
    TinyFixture("gemma_mqa_wide_head", "gemma", 2, {"num_key_value_heads": 1, "head_dim": 32}),
    TinyFixture("gemma2_sliding", "gemma2", 1),
    TinyFixture("gemma2_softcaps", "gemma2", 2, {"final_logit_softcapping": 5.0, "attn_logit_softcapping": 2.0,
                                                  "num_hidden_layers": 3}),
)
