"""archrun family plugin for Qwen: qwen2, qwen3, qwen3moe (descriptions only, no math).

What the files do not say:
- rope pairing is NEOX for all three (llama.cpp LLAMA_ROPE_TYPE_NEOX);
- qwen3moe always renormalises the selected expert weights (llama.cpp does, released
  models set norm_topk_prob=True; no GGUF key records it);
- gating is softmax; the FFN activation is SiLU (SwiGLU); blocks are sequential pre-norm
  transformer blocks; embeddings are not scaled.
Everything else (q/k norms, QKV biases, head_dim from key_length, tied output) is read
from the file by the generic compiler.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.text.reasoning import THINK_TAGS
from archrun_qwen.tools import QwenToolCalls

_QWEN = dict(TRANSFORMER, rope_pairing="neox", activation="silu", embed_scale=1.0)

HINTS = {
    "qwen2": FamilyHints(name="qwen2", **_QWEN),
    "qwen3": FamilyHints(name="qwen3", **_QWEN),
    "qwen3moe": FamilyHints(name="qwen3moe", gating="softmax", moe_weights_norm=True, **_QWEN),
}


plugin = FamilyPlugin(HINTS, tool_calls=QwenToolCalls(), reasoning=THINK_TAGS)
