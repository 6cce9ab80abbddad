"""archrun family plugin for MiniMax-M2 (`minimax-m2`; descriptions only, no math).

What minimax-m2 files do not say (llama.cpp src/models/minimax-m2.cpp, HF modeling_minimax_m2.py):
pre-RMSNorm blocks; Q and K RMS-normed over all heads at once (norm widths n_head x head_dim and
n_head_kv x head_dim, found by shape) before rope; partial rope (`rope.dimension_count`) with NEOX
pairing; every layer a mixture of SwiGLU experts: sigmoid scores (the file's `expert_gating_func`),
top-k chosen by score plus the selection bias (`exp_probs_b`), the chosen experts weighted by their
plain sigmoid scores renormalised to sum 1; no shared expert.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "minimax-m2": FamilyHints(name="minimax-m2", rope_pairing="neox", activation="silu", embed_scale=1.0,
                              moe_weights_norm=True, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
