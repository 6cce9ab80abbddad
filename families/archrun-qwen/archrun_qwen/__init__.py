"""archrun family plugin for Qwen: qwen2, qwen3, qwen3moe (descriptions only, no math).

What the files do not say:
- rope pairing is NEOX for all three (llama.cpp LLAMA_ROPE_TYPE_NEOX);
- qwen3moe always renormalises the selected expert weights (llama.cpp does, released
  models set norm_topk_prob=True; no GGUF key records it);
- gating is softmax.
Everything else (q/k norms, QKV biases, head_dim from key_length, tied output) is read
from the file by the generic compiler.
"""

from __future__ import annotations

from archrun.compile import FamilyHints, FamilyPlugin

HINTS = {
    "qwen2": FamilyHints(name="qwen2", rope_pairing="neox"),
    "qwen3": FamilyHints(name="qwen3", rope_pairing="neox"),
    "qwen3moe": FamilyHints(name="qwen3moe", rope_pairing="neox", gating="softmax", moe_weights_norm=True),
}


plugin = FamilyPlugin(HINTS)
