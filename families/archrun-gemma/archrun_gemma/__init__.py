"""archrun family plugin for Gemma (v1) and Gemma 2 (descriptions only, no math).

What the files do not say (llama.cpp src/models/gemma.cpp, gemma2-iswa.cpp; HF modeling_gemma.py,
modeling_gemma2.py): rope NEOX pairing; token embeddings scaled by sqrt(n_embd); GeGLU with
tanh-GELU; the converter already added 1 to every norm weight (HF computes x * (1 + w)), so plain
RMSNorm applies; heads are tied (the converter drops any lm_head).
- gemma2 also: sandwich norms (by tensor presence); sliding-window and global layers alternate,
  sliding first (llama.cpp fixes the period at 2); attention scores and final logits are
  softcapped (the file's `attn_logit_softcapping` / `final_logit_softcapping`) with tanh.
The file carries no chat template: the default is Gemma's turn format.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun_gemma3 import CHAT_TEMPLATE  # Gemma's turn format, shared by every Gemma generation

_GEMMA = dict(rope_pairing="neox", activation="gelu_tanh", embed_scale="sqrt_n_embd", chat_template=CHAT_TEMPLATE,
              **TRANSFORMER)

HINTS = {
    "gemma": FamilyHints(name="gemma", **_GEMMA),
    "gemma2": FamilyHints(name="gemma2", swa_period=2, **_GEMMA),
}

plugin = FamilyPlugin(HINTS)
