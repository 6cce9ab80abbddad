"""archrun-cohere's tiny fixtures: HF CohereForCausalLM / Cohere2ForCausalLM, converted by llama.cpp's converter.

Cohere's configs name the LayerNorm epsilon `layer_norm_eps` and carry no RMS epsilon; Cohere2's
carry `rotary_pct`, which llama.cpp's converter reads (the fixtures set both as real files do).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

_COMMON = {"num_hidden_layers": 2, "layer_norm_eps": 1e-5, "rms_norm_eps": None, "tie_word_embeddings": True,
           "logit_scale": 0.5}
COMMAND_R = HfArch("command-r", "cohere", "CohereForCausalLM", "CohereConfig", converter="llama.cpp",
                   defaults=_COMMON)
COHERE2 = HfArch("cohere2", "cohere2", "Cohere2ForCausalLM", "Cohere2Config", converter="llama.cpp",
                 defaults={**_COMMON, "num_hidden_layers": 4, "sliding_window": 8, "rotary_pct": 1.0})

ARCHES = (COMMAND_R, COHERE2)

FIXTURES = (
    TinyFixture("command_r_gqa", "command-r", 1),
    TinyFixture("command_r_mha_3layer", "command-r", 2, {"num_key_value_heads": 4, "num_hidden_layers": 3,
                                                          "logit_scale": 2.0}),
    # Command R+'s per-head Q/K LayerNorms ({hd, H} weights); 64 layers because llama.cpp loads them
    # only in 64-layer models (narrow to stay small)
    TinyFixture("command_r_qknorm_64layer", "command-r", 3, {
        "use_qk_norm": True, "num_hidden_layers": 64, "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 16}),
    TinyFixture("cohere2_sliding", "cohere2", 1),
    TinyFixture("cohere2_8layer", "cohere2", 2, {"num_hidden_layers": 8, "num_attention_heads": 8,
                                                  "num_key_value_heads": 2}),
)
