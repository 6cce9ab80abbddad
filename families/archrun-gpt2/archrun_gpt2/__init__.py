"""archrun family plugin for GPT-2 (descriptions only, no math).

What gpt2 files do not say (llama.cpp src/models/gpt2.cpp, HF modeling_gpt2.py): positions are
learned absolute embeddings (the `position_embd` tensor, found by presence) and there is no
rotary embedding; blocks are sequential pre-LayerNorm blocks (the norm is named by the file's
`layer_norm_epsilon` key); the MLP is plain GELU with the tanh approximation (HF's `gelu_new`);
Q/K/V come fused in `attn_qkv`, and every projection carries a bias (all by tensor presence).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "gpt2": FamilyHints(name="gpt2", rope_pairing="none", activation="gelu_tanh", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
