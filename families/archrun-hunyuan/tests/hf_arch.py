"""archrun-hunyuan's tiny fixtures: HF HunYuanDenseV1ForCausalLM, converted by llama.cpp's own converter.

The converter reads `head_dim` from the config (transformers leaves it unset by default).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

HUNYUAN = HfArch("hunyuan-dense", "hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config",
                 converter="llama.cpp", defaults={"num_hidden_layers": 2, "head_dim": 16})

ARCHES = (HUNYUAN,)

FIXTURES = (
    TinyFixture("hunyuan_dense_gqa", "hunyuan_v1_dense", 1),
    TinyFixture("hunyuan_dense_tied_3layer", "hunyuan_v1_dense", 2, {"tie_word_embeddings": True,
                                                                      "num_hidden_layers": 3}),
)
