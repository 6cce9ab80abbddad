"""archrun family plugin for Arcee (AFM; `arcee`; descriptions only, no math).

What arcee files do not say (llama.cpp src/models/arcee.cpp, HF modeling_arcee.py): a llama
block whose MLP is not gated: down(relu(up(x))^2) (ReLU², the `relu2` activation; the plain
up/down FFN is found by the absent ffn_gate); rope pairing NORM (llama.cpp's converter permutes
the Q/K rows as for llama); sequential pre-RMSNorm blocks; embeddings not scaled.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "arcee": FamilyHints(name="arcee", rope_pairing="norm", activation="relu2", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
