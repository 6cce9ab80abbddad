"""archrun family plugin for qwen35 and qwen35moe (Qwen3.5's text models; descriptions only, no math).

What qwen35 files do not say (llama.cpp src/models/qwen35.cpp, HF modeling_qwen3_5.py): as
qwen3next, layers are gated DeltaNet mixers or gated attention (archrun-recurrent), but the
converter stores every value-head tensor in tiled order (value head j reads key head j % key heads:
"gated_deltanet_tiled") with separate `ssm_beta`/`ssm_alpha` projections, and the FFN is a dense
SwiGLU (qwen35moe: a softmax top-k mixture renormalised over the chosen experts plus a
sigmoid-gated shared expert, as qwen3next's). Rope is interleaved MRoPE, which for text (one
position on every axis) is NEOX rope on the first `rope.dimension_count` dims;
`rope.dimension_sections` only matters for images.
"""

from __future__ import annotations

import attrs

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "qwen35": FamilyHints(name="qwen35", rope_pairing="neox", activation="silu", embed_scale=1.0,
                          recurrent="gated_deltanet_tiled",
                          tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight", "post_attn_norm": None,
                                        "ssm_a": "blk.{i}.ssm_a"},
                          **{**TRANSFORMER, "attention": "gated_causal"}),
}
HINTS["qwen35moe"] = attrs.evolve(HINTS["qwen35"], name="qwen35moe", gating="softmax", moe_weights_norm=True)

plugin = FamilyPlugin(HINTS)
