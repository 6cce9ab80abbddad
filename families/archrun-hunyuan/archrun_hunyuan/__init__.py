"""archrun family plugin for HunYuan dense (`hunyuan-dense`; descriptions only, no math).

What hunyuan-dense files do not say (llama.cpp src/models/hunyuan-dense.cpp, HF
modeling_hunyuan_v1_dense.py): a llama-like block (pre-RMSNorm, SwiGLU, rope NEOX pairing) whose
per-head Q/K RMS norms apply to the *rotated* Q and K; the NTK "alpha" rope scaling arrives
already folded into `rope.freq_base` by the converter.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "hunyuan-dense": FamilyHints(name="hunyuan-dense", rope_pairing="neox", activation="silu", embed_scale=1.0,
                                 qk_norm_after_rope=True, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
