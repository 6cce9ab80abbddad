"""archrun family plugin for llama4 (Llama 4 text models; descriptions only, no math).

What llama4 files do not say (llama.cpp src/models/llama4.cpp, HF modeling_llama4.py): rope NORM
pairing (HF's complex rotation of adjacent pairs); every 4th layer (i % 4 == 3) is global
attention without rope and the other three are chunked (llama.cpp: chunk 8192 unless the file
says `attention.sliding_window` 0); attention "llama4" and the input-weighted expert mixture
"topk_input_weighted" come from the vocabulary package archrun-llama4-ops; sigmoid gating of the
top-k router logits, weights not renormalised; SwiGLU experts plus a shared expert, MoE layers
where the file has a router (interleave_moe_layer_step).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "llama4": FamilyHints(name="llama4", rope_pairing="norm", activation="silu", embed_scale=1.0, gating="sigmoid",
                          swa_period=4, nope_period=4, defaults={"attention.sliding_window": 8192},
                          **{**TRANSFORMER, "attention": "llama4", "moe": "topk_input_weighted"}),
}

plugin = FamilyPlugin(HINTS)
