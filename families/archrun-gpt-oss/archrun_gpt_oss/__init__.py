"""archrun family plugin for gpt-oss (descriptions only, no math).

What gpt-oss files do not say (llama.cpp src/models/openai-moe.cpp, HF modeling_gpt_oss.py): rope
NEOX pairing; layers alternate sliding (even) and full attention (period 2), every layer with the
same rope (the file's YaRN and its attention factor: HF's one rotary embedding, llama.cpp's
default for sliding layers); YaRN's correction dims are not rounded (HF's `truncate: false`, the
released checkpoints' setting; llama.cpp rounds them); the norm before the
MoE is stored as `post_attention_norm`; experts use the clamped SwiGLU ("swiglu_oai": alpha
1.702, limit 7, up + 1); routing is top-k on the router logits then a softmax over the selected
ones, which equals softmax gating with the selected weights renormalised. Attention sinks, the
Q/K/V/O, router and expert biases are found by tensor presence.

Replies use OpenAI's harmony format: thinking in the analysis channel, the answer in the final one
(`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`); the
markup tokens are written out as text, so HARMONY splits a reply like any open/close format: the
analysis closes at `<|end|><|start|>assistant`, the final channel's header is dropped, and a tool
call's header (commentary channel, `to=functions.NAME`) is kept for HarmonyToolCalls (tools.py).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.text.reasoning import ReasoningFormat
from archrun_gpt_oss.tools import HarmonyToolCalls

__all__ = ["HARMONY", "HINTS", "HarmonyToolCalls", "plugin"]

# the analysis channel, closed where the next assistant message starts (the final channel, whose header
# is dropped, or a tool call on the commentary channel); a reply may also start with the final channel
HARMONY = ReasoningFormat(open="<|channel|>analysis<|message|>", close="<|end|><|start|>assistant",
                          name="harmony", answer_open="<|channel|>final<|message|>")

HINTS = {
    "gpt-oss": FamilyHints(name="gpt-oss", rope_pairing="neox", activation="swiglu_oai", embed_scale=1.0,
                           gating="softmax", moe_weights_norm=True, swa_period=2,
                           yarn_truncate=False,
                           tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight", "post_attn_norm": None},
                           **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS, tool_calls=HarmonyToolCalls(), reasoning=HARMONY)
