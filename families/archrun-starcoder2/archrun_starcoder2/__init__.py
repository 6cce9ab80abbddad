"""archrun family plugin for StarCoder2 (`starcoder2`; descriptions only, no math).

What starcoder2 files do not say (llama.cpp src/models/starcoder2.cpp, HF modeling_starcoder2.py):
the norm is LayerNorm (with bias). llama.cpp's converter writes both
`attention.layer_norm_epsilon` and `attention.layer_norm_rms_epsilon` (the generic
`TextModel.set_gguf_parameters` adds the second from HF's `norm_epsilon`), so the epsilon key
cannot name the norm: the family states it. Rope pairing NEOX (HF's rotate_half); the MLP is
plain (not gated) GELU with the tanh approximation (HF's gelu_pytorch_tanh); sequential
pre-norm blocks; embeddings not scaled. Biases (use_bias) are found by tensor presence.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "starcoder2": FamilyHints(name="starcoder2", rope_pairing="neox", activation="gelu_tanh", norm="layer",
                              embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
