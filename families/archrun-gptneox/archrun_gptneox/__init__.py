"""archrun family plugin for GPT-NeoX / Pythia (descriptions only, no math).

What gptneox files do not say (llama.cpp src/models/gptneox.cpp, HF modeling_gpt_neox.py): rope
NEOX pairing on the first `rope.dimension_count` dims of each head (partial rotary); LayerNorm
(the file's `layer_norm_epsilon` key) with biases; fused QKV and every projection with a bias;
a plain exact-GELU MLP. Whether blocks are parallel (x + attn(ln1 x) + mlp(ln2 x)) or sequential
the file says by its `use_parallel_residual` key.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "gptneox": FamilyHints(name="gptneox", rope_pairing="neox", activation="gelu", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
