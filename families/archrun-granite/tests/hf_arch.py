"""archrun-granite's tiny fixtures: HF GraniteForCausalLM, converted by llama.cpp's own converter."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

GRANITE = HfArch("granite", "granite", "GraniteForCausalLM", "GraniteConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2, "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                           "attention_multiplier": 0.2, "logits_scaling": 2.0})

GRANITEMOE = HfArch("granitemoe", "granitemoe", "GraniteMoeForCausalLM", "GraniteMoeConfig", converter="llama.cpp",
                    defaults={"num_hidden_layers": 2, "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                              "attention_multiplier": 0.2, "logits_scaling": 2.0, "num_local_experts": 4,
                              "num_experts_per_tok": 2})

ARCHES = (GRANITE, GRANITEMOE)

FIXTURES = (
    TinyFixture("granite_gqa", "granite", 1),
    TinyFixture("granite_tied_bias", "granite", 2, {"tie_word_embeddings": True, "attention_bias": True,
                                                     "mlp_bias": True, "logits_scaling": 0.25,
                                                     "embedding_multiplier": 12.0, "residual_multiplier": 0.22}),
    TinyFixture("granitemoe_4experts", "granitemoe", 1),
    TinyFixture("granitemoe_8experts_tied", "granitemoe", 2, {"num_local_experts": 8, "num_experts_per_tok": 3,
                                                               "tie_word_embeddings": True}),
)
