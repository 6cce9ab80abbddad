"""archrun family plugin for granitehybrid (Granite 4.0 hybrids; descriptions only, no math).

What granitehybrid files do not say (llama.cpp src/models/granite-hybrid.cpp, HF
modeling_granitemoehybrid.py): layers whose per-layer `attention.head_count_kv` is 0 are Mamba2
mixers ("mamba2", from the archrun-recurrent vocabulary package; `ssm_a`/`ssm_d` stored without
`.weight`), the others causal attention without rotary embedding (Granite 4.0's hybrids are NoPE:
their converter writes `rope.scaling.finetuned` false); a SwiGLU FFN (dense, or a softmax top-k
mixture renormalised over the chosen experts plus a shared expert); granite's multipliers are keys
of the file (`embedding_scale`, `residual_scale`, `attention.scale`, `logit_scale`, which divides).
Bamba files (also `granitehybrid`, with rope) are not described.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "granitehybrid": FamilyHints(name="granitehybrid", rope_pairing="none", activation="silu", embed_scale=1.0,
                                 logit_scale_key="divide", gating="softmax", moe_weights_norm=True,
                                 recurrent="mamba2",
                                 tensor_names={"ssm_a": "blk.{i}.ssm_a", "ssm_d": "blk.{i}.ssm_d"}, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
