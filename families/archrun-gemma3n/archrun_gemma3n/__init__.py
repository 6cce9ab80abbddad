"""archrun family plugin for Gemma 3n text models (descriptions only, no math).

What gemma3n files do not say (llama.cpp src/models/gemma3n-iswa.cpp, HF modeling_gemma3n.py):
- stream `altup` (archrun-gemma3n-ops): the residual stream is `altup.num_inputs` parallel streams the
  blocks run on one of, with the per-layer inputs (`per_layer_token_embd`, `per_layer_model_proj`) joining
  each block's corrected stream; the file states the counts and widths;
- residual `gemma3n_laurel`: LAuReL's low-rank branch on the block's normed input joins the attention,
  (x + attn + laurel) / sqrt(2), then the FFN's post-normed output adds on; sandwich norms by presence;
- activation `gelu_tanh_sparse`: GeGLU (tanh) whose gate is cut at each layer's Gaussian quantile
  (`activation_sparsity_scale`; -inf: no cut);
- attention `gemma3n`: q/k norms, RMS-normed values, unscaled scores, the last `attention.shared_kv_layers`
  layers reusing the keys and values of the last earlier layer of their kind (archrun-gemma4-ops' KV
  sharing); the kinds from `attention.sliding_window_pattern`;
- rope pairing NEOX, the sliding layers plain with `rope.freq_base_swa` (HF's default rope there);
- token embeddings scaled by sqrt(n_embd); norms stored as is (x * w); final logit softcap from the file;
- released checkpoints carry k/v projections and k norms on the KV-sharing layers, which neither HF nor
  llama.cpp uses (and llama.cpp 0.3.36 requires): files converted from them load with a warning
  (`ignored_tensors`; on the other layers the attention binds them).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "gemma3n": FamilyHints(
        name="gemma3n",
        **{**TRANSFORMER, "attention": "gemma3n", "residual": "gemma3n_laurel"},
        stream="altup",
        rope_pairing="neox",
        activation="gelu_tanh_sparse",
        embed_scale="sqrt_n_embd",
        swa_rope="plain",
        ignored_tensors=("blk.*.attn_k.weight", "blk.*.attn_v.weight", "blk.*.attn_k_norm.weight"),
    ),
}


plugin = FamilyPlugin(HINTS)
