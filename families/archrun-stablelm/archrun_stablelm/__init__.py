"""archrun family plugin for StableLM (`stablelm`; descriptions only, no math).

What stablelm files do not say (llama.cpp src/models/stablelm.cpp, HF modeling_stablelm.py):
rope pairing NEOX (HF's rotate_half) on the first rope.dimension_count dims of each head
(partial rope, HF's partial_rotary_factor); the MLP is SwiGLU (SiLU); blocks are sequential
pre-norm blocks. The norm is LayerNorm with bias, named by the file's `layer_norm_epsilon` key;
Q/K/V biases (use_qkv_bias) are found by tensor presence.

Not described (such files fail to load or are refused, never run wrong): StableLM-2-12B's
parallel blocks (`use_parallel_residual = true`, no ffn_norm) need the residual topology read
from that key per file, and its per-head Q/K LayerNorms are stored as [n_head, head_dim] tensors.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "stablelm": FamilyHints(name="stablelm", rope_pairing="neox", activation="silu", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
