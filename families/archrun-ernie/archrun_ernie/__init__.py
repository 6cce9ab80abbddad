"""archrun family plugin for ERNIE 4.5, dense (`ernie4_5`) and MoE (`ernie4_5-moe`); descriptions only, no math.

What ernie4_5 files do not say (llama.cpp src/models/ernie4-5.cpp, HF modeling_ernie4_5.py):
rope pairing NORM (HF's interleaved rotate_half: adjacent pairs, as llama.cpp's rope type NORM
for ernie4_5); SwiGLU (SiLU); sequential pre-RMSNorm blocks; embeddings not scaled. Head widths
(key_length/value_length), biases (use_bias) and tied embeddings are read from the file.
ernie4_5-moe (llama.cpp src/models/ernie4-5-moe.cpp): leading dense layers, then MoE layers whose
softmax router selects by score + `exp_probs_b` and renormalises the selected weights, plus
shared experts (all by tensor presence; the renormalisation is the family's).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "ernie4_5": FamilyHints(name="ernie4_5", rope_pairing="norm", activation="silu", embed_scale=1.0, **TRANSFORMER),
    "ernie4_5-moe": FamilyHints(name="ernie4_5-moe", rope_pairing="norm", activation="silu", embed_scale=1.0,
                                gating="softmax", moe_weights_norm=True, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
