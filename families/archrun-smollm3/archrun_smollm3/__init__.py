"""archrun family plugin for SmolLM3 (`smollm3`; descriptions only, no math).

What smollm3 files do not say (llama.cpp src/models/smollm3.cpp, HF modeling_smollm3.py): every
4th layer (i % 4 == 3) uses no rotary embedding (NoPE; HF's default `no_rope_layer_interval` 4,
llama.cpp's fixed `n_no_rope_layer_step` 4 — llama.cpp's converter writes no key for it, so
checkpoints with another interval do not convert faithfully); the other layers rope with NORM
pairing (the converter permutes Q/K rows as for llama); SwiGLU (SiLU); sequential pre-RMSNorm
blocks; embeddings not scaled.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "smollm3": FamilyHints(name="smollm3", rope_pairing="norm", activation="silu", embed_scale=1.0, nope_period=4,
                           **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
