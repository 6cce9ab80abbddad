"""archrun-hunyuan's tiny fixtures: HF HunYuanDenseV1ForCausalLM and HunYuanMoEV1ForCausalLM, converted by
llama.cpp's own converter.

The converter reads `head_dim` from the config (transformers leaves it unset by default). For the
MoE model it reads the per-layer lists `moe_topk`, `moe_intermediate_size` and `num_shared_expert`
of released checkpoints (transformers 5 keeps none but `moe_topk`, and sizes the experts by
`intermediate_size`): `checkpoint_config` writes them. Hunyuan-A13B's NTK-alpha rope is folded
into the base only for its own shape (alpha 1000, head width 128; the converter asserts it), so the
fixtures rotate plain.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

HUNYUAN = HfArch("hunyuan-dense", "hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config",
                 converter="llama.cpp", defaults={"num_hidden_layers": 2, "head_dim": 16})



def _moe_checkpoint_config(hp):
    n = hp["num_hidden_layers"]
    return {"moe_topk": [hp["moe_topk"]] * n, "moe_intermediate_size": [hp["intermediate_size"]] * n,
            "num_shared_expert": [1] * n}


HUNYUAN_MOE = HfArch("hunyuan-moe", "hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config",
                     converter="llama.cpp", defaults={"num_hidden_layers": 2, "head_dim": 16, "num_experts": 4,
                                                      "moe_topk": 2, "intermediate_size": 32},
                     checkpoint_config=_moe_checkpoint_config)

ARCHES = (HUNYUAN, HUNYUAN_MOE)

FIXTURES = (
    TinyFixture("hunyuan_dense_gqa", "hunyuan_v1_dense", 1),
    TinyFixture("hunyuan_dense_tied_3layer", "hunyuan_v1_dense", 2, {"tie_word_embeddings": True,
                                                                      "num_hidden_layers": 3}),
    TinyFixture("hunyuan_moe_4experts_top2", "hunyuan_v1_moe", 1),
    TinyFixture("hunyuan_moe_8experts_top3", "hunyuan_v1_moe", 2, {"num_experts": 8, "moe_topk": 3,
                                                                    "num_attention_heads": 8, "head_dim": 8}),
)
