"""archrun family plugin for EXAONE 3.x, EXAONE 4 and EXAONE MoE (descriptions only, no math).

What exaone files (EXAONE 3.0 / 3.5; llama.cpp src/models/exaone.cpp, HF's Llama implementation
with ExaoneConfig) do not say: llama's pre-RMSNorm blocks with SwiGLU, but rope NEOX pairing (the
converter does not permute Q/K); llama3-style rope scaling arrives as `rope_freqs` frequency
factors, biases by presence.

What exaone4 files do not say (llama.cpp src/models/exaone4.cpp, HF modeling_exaone4.py): blocks
have no pre-norms — the attention and FFN outputs are RMS-normed (`post_attention_norm`,
`post_ffw_norm`) before they join the stream; per-head Q/K RMS norms; rope NEOX pairing on the
sliding-window layers only: when the model has sliding layers (the file's
`attention.sliding_window_pattern`), its full-attention layers use no rotary embedding; SwiGLU.

exaone-moe (K-EXAONE; llama.cpp src/models/exaone-moe.cpp, HF modeling_exaone_moe.py): the same
attention (per-head Q/K norms before rope, rope on the sliding layers only when there are any) in
pre-RMSNorm blocks; the first `leading_dense_block_count` layers have a dense SwiGLU FFN, the others
a mixture of SwiGLU experts: sigmoid scores, top-k chosen by score plus the selection bias
(`exp_probs_b`), the chosen plain scores renormalised (`expert_weights_norm`) and scaled
(`expert_weights_scale`), plus the shared experts (`ffn_*_shexp`) added unweighted.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "exaone": FamilyHints(name="exaone", rope_pairing="neox", activation="silu", embed_scale=1.0, **TRANSFORMER),
    "exaone4": FamilyHints(name="exaone4", rope_pairing="neox", activation="silu", embed_scale=1.0,
                           pre_norms=False, nope_global=True, **TRANSFORMER),
    "exaone-moe": FamilyHints(name="exaone-moe", rope_pairing="neox", activation="silu", embed_scale=1.0,
                              nope_global=True, gating="sigmoid", **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
