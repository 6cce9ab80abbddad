"""archrun family plugin for Jais 2 (descriptions only, no math).

What jais2 files do not say (llama.cpp src/models/jais2.cpp, HF modeling_jais2.py): pre-LayerNorm
blocks with learned weights and biases (`attn_norm`, `ffn_norm`, `output_norm`, the file's
`layer_norm_epsilon`); biased Q/K/V and output projections; rope NEOX pairing (the converter does not
permute Q/K); a plain FFN down(relu(up x)^2) with biases.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "jais2": FamilyHints(name="jais2", rope_pairing="neox", activation="relu2", embed_scale=1.0, norm="layer",
                         **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
