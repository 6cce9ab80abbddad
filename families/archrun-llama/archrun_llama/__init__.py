"""archrun family plugin for llama (descriptions only, no math).

What the files do not say: rope pairing is NORM (adjacent pairs) — llama.cpp's converter
permutes the Q/K rows of HF checkpoints so that NORM pairing is right on them. llama3-style
rope scaling arrives as a `rope_freqs` tensor, which the generic compiler picks up. The FFN is
SwiGLU (SiLU activation), blocks are sequential pre-norm blocks, embeddings are not scaled.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.text.reasoning import THINK_TAGS
from archrun_llama.tools import Llama3ToolCalls

HINTS = {"llama": FamilyHints(name="llama", rope_pairing="norm", activation="silu", embed_scale=1.0, **TRANSFORMER)}


plugin = FamilyPlugin(HINTS, tool_calls=Llama3ToolCalls(), reasoning=THINK_TAGS)
