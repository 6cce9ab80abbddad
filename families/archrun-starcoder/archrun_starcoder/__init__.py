"""archrun family plugin for StarCoder (HF GPT-BigCode; descriptions only, no math).

What starcoder files do not say (llama.cpp src/models/starcoder.cpp, HF modeling_gpt_bigcode.py):
positions are learned absolute embeddings (`position_embd`, found by presence), no rotary
embedding; sequential pre-LayerNorm blocks with biases (the norm named by the file's
`layer_norm_epsilon` key); multi-query attention (one K/V head, `attention.head_count_kv` 1) from
the fused `attn_qkv` projection; a plain GELU MLP with the tanh approximation (HF's
`gelu_pytorch_tanh`); the output head is tied to the token embedding unless the file has `output`.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "starcoder": FamilyHints(name="starcoder", rope_pairing="none", activation="gelu_tanh", embed_scale=1.0,
                             **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
