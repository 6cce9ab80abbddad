"""archrun family plugin for Cohere Command-R and Cohere2 (descriptions only, no math).

What the files do not say (llama.cpp src/models/command-r.cpp, cohere2-iswa.cpp; HF
modeling_cohere.py, modeling_cohere2.py):
- parallel blocks: one LayerNorm (no bias) feeds both attention and the FFN, and the block adds
  both to its input; SwiGLU; rope NORM pairing (Cohere rotates interleaved pairs; the converter
  does not permute); the file's `logit_scale` key multiplies the logits; heads are tied.
- cohere2 also: three sliding-window layers before each global one (llama.cpp fixes the period
  at 4; the file states only the window), and only the sliding layers use rope.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

_COHERE = dict(rope_pairing="norm", activation="silu", embed_scale=1.0, logit_scale_key="multiply",
               **{**TRANSFORMER, "residual": "parallel"})

HINTS = {
    "command-r": FamilyHints(name="command-r", **_COHERE),
    "cohere2": FamilyHints(name="cohere2", swa_period=4, nope_global=True, **_COHERE),
}

plugin = FamilyPlugin(HINTS)
