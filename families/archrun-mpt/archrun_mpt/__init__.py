"""archrun family plugin for MPT (descriptions only, no math).

What mpt files do not say (llama.cpp src/models/mpt.cpp, HF modeling_mpt.py): positions are
ALiBi biases (the file's `attention.max_alibi_bias`), no rotary embedding; sequential pre-
LayerNorm blocks without biases (MPT's `no_bias`); a plain exact-GELU MLP; fused QKV; Q/K/V
clipped to the file's `attention.clamp_kqv` when it has one; heads tied to the embeddings.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "mpt": FamilyHints(name="mpt", rope_pairing="none", activation="gelu", embed_scale=1.0,
                       **{**TRANSFORMER, "attention": "alibi"}),
}

plugin = FamilyPlugin(HINTS)
