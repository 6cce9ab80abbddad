"""archrun family plugin for Nemotron (Nemotron-3 / Minitron; `nemotron`; descriptions only, no math).

What nemotron files do not say (llama.cpp src/models/nemotron.cpp, HF modeling_nemotron.py):
HF's LayerNorm1P computes LayerNorm with weight (1 + w); llama.cpp's converter stores 1 + w, so
the file's norm is a plain LayerNorm (with bias). The converter writes both
`attention.layer_norm_epsilon` and `attention.layer_norm_rms_epsilon`, so the epsilon key cannot
name the norm: the family states it. The MLP is not gated: down(relu(up(x))^2) (ReLU², the
`relu2` activation); rope pairing NEOX (HF's rotate_half) on the first rope.dimension_count dims
(partial rope); sequential pre-norm blocks; embeddings not scaled.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "nemotron": FamilyHints(name="nemotron", rope_pairing="neox", activation="relu2", norm="layer", embed_scale=1.0,
                            **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
