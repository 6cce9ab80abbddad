"""archrun family plugin for EXAONE 4 (descriptions only, no math).

What exaone4 files do not say (llama.cpp src/models/exaone4.cpp, HF modeling_exaone4.py): blocks
have no pre-norms — the attention and FFN outputs are RMS-normed (`post_attention_norm`,
`post_ffw_norm`) before they join the stream; per-head Q/K RMS norms; rope NEOX pairing on the
sliding-window layers only: when the model has sliding layers (the file's
`attention.sliding_window_pattern`), its full-attention layers use no rotary embedding; SwiGLU.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "exaone4": FamilyHints(name="exaone4", rope_pairing="neox", activation="silu", embed_scale=1.0,
                           pre_norms=False, nope_global=True, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
