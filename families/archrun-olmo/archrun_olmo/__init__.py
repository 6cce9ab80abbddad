"""archrun family plugin for OLMo, OLMo 2 and OLMoE (descriptions only, no math).

What the files do not say (llama.cpp src/models/olmo.cpp, olmo2.cpp; HF modeling_olmo.py,
modeling_olmo2.py):
- olmo: LayerNorm without learned weight or bias (no norm tensors at all), rope NORM pairing (the
  converter permutes Q/K as for llama), SwiGLU, sequential pre-norm blocks; the optional
  `attention.clamp_kqv` clips Q, K and V.
- olmo2: no pre-norms — attention reads the residual stream and the FFN reads x + a as is; the
  sublayer outputs are RMS-normed (`post_attention_norm`, `post_ffw_norm`) before they join;
  Q/K RMS norms span all heads (their width is n_head x head_dim, found by shape); rope NEOX
  pairing (no Q/K permutation); SwiGLU; sliding-window layers when the file says so (OLMo 3), and
  those rotate plain: the base alone, no scaling (`swa_rope="plain"`; llama.cpp's olmo2.cpp: freq
  scale 1, no YaRN on sliding layers; HF Olmo3: the sliding layers' default rope).
- olmoe (llama.cpp src/models/olmoe.cpp): pre-RMSNorm blocks with all-heads Q/K norms, rope
  NEOX, and a MoE FFN: softmax router, top-k, selected weights not renormalised.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "olmo": FamilyHints(name="olmo", rope_pairing="norm", activation="silu", embed_scale=1.0, norm="layer",
                        norm_weights=False, **TRANSFORMER),
    "olmoe": FamilyHints(name="olmoe", rope_pairing="neox", activation="silu", embed_scale=1.0, gating="softmax",
                         **TRANSFORMER),
    "olmo2": FamilyHints(name="olmo2", rope_pairing="neox", activation="silu", embed_scale=1.0, pre_norms=False,
                         swa_rope="plain", **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
