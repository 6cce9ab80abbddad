"""archrun family plugin for Apertus (descriptions only, no math).

What apertus files do not say (llama.cpp src/models/apertus.cpp, HF modeling_apertus.py): pre-RMSNorm
blocks (`attn_norm`, `ffn_norm`); per-head Q/K RMS norms before rope; rope NEOX pairing (the
converter does not permute Q/K), llama3-style scaling as `rope_freqs` frequency factors; a plain
(ungated) FFN, down(xielu(up x)), whose xIELU activation reads each layer's learned alpha_n,
alpha_p, beta and eps from the file's `xielu.*` keys (the `xielu` op of archrun-blocks).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "apertus": FamilyHints(name="apertus", rope_pairing="neox", activation="xielu", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
