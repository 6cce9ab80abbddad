"""archrun family plugin for Seed-OSS (`seed_oss`; descriptions only, no math).

What seed_oss files do not say (llama.cpp src/models/seed-oss.cpp, HF modeling_seed_oss.py):
the tensor named `post_attention_norm` is the *pre-FFN* norm (HF's post_attention_layernorm;
llama.cpp's seed_oss loader reads it as `attn_post_norm` and applies it to the FFN input), so the
role `ffn_norm` is remapped to it and there is no post-attention (sandwich) norm. Rope pairing
NEOX (HF's rotate_half); SwiGLU (SiLU); sequential pre-RMSNorm blocks; embeddings not scaled.
Q/K/V biases and the output-projection bias are found by tensor presence.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "seed_oss": FamilyHints(
        name="seed_oss", rope_pairing="neox", activation="silu", embed_scale=1.0,
        tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight", "post_attn_norm": None},
        **TRANSFORMER,
    ),
}

plugin = FamilyPlugin(HINTS)
