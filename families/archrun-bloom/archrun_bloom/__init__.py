"""archrun family plugin for BLOOM (descriptions only, no math).

What bloom files do not say (llama.cpp src/models/bloom.cpp and its hparams loader, HF
modeling_bloom.py): positions are ALiBi biases, no rotary embedding; the ALiBi maximum bias is
8 (llama.cpp fixes it for bloom; the converter writes no key); blocks are sequential
pre-LayerNorm blocks (the file's `layer_norm_epsilon` key names LayerNorm); the token
embeddings pass through a LayerNorm (`token_embd_norm`, found by presence); the MLP is plain
GELU with the tanh approximation (HF's bloom_gelu); fused QKV and biases by tensor presence.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "bloom": FamilyHints(name="bloom", rope_pairing="none", activation="gelu_tanh", embed_scale=1.0,
                         defaults={"attention.max_alibi_bias": 8.0}, **{**TRANSFORMER, "attention": "alibi"}),
}

plugin = FamilyPlugin(HINTS)
