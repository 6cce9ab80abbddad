"""archrun family plugin for dots.llm1 (descriptions only, no math).

What dots1 files do not say (llama.cpp src/models/dots1.cpp, HF modeling_dots1.py): a Qwen3-style
block (per-head Q/K RMS norms, rope NEOX pairing), leading dense layers, then DeepSeek-V3-style
MoE layers: a sigmoid router selecting by score + `exp_probs_b` (the file states the gating
function, the renormalisation and the scale by key), shared experts by tensor presence.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "dots1": FamilyHints(name="dots1", rope_pairing="neox", activation="silu", embed_scale=1.0, gating="sigmoid",
                         **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
