"""archrun family plugin for qwen3next (Qwen3-Next; descriptions only, no math).

What qwen3next files do not say (llama.cpp src/models/qwen3next.cpp, HF modeling_qwen3_next.py):
all layers but every `full_attention_interval`-th are gated DeltaNet mixers ("gated_deltanet", from
the archrun-recurrent vocabulary package; `ssm_a` stored without `.weight`); the others are gated
attention ("gated_causal": the query projection also yields a sigmoid gate on the output) with
per-head Q/K norms and NEOX rope on the first `rope.dimension_count` dims; every layer's FFN is a
softmax top-k mixture renormalised over the chosen experts plus a sigmoid-gated shared expert; the
FFN's pre-norm is stored as `post_attention_norm`.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "qwen3next": FamilyHints(name="qwen3next", rope_pairing="neox", activation="silu", embed_scale=1.0,
                             gating="softmax", moe_weights_norm=True, recurrent="gated_deltanet",
                             tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight", "post_attn_norm": None,
                                           "ssm_a": "blk.{i}.ssm_a"},
                             **{**TRANSFORMER, "attention": "gated_causal"}),
}

plugin = FamilyPlugin(HINTS)
