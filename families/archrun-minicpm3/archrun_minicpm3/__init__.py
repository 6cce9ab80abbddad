"""archrun family plugin for MiniCPM3 (descriptions only, no math).

What minicpm3 files do not say (HF modeling_minicpm3.py, llama.cpp src/models/minicpm3.cpp): its
converter writes none of MiniCPM3's multipliers, so the family states the values llama.cpp's graph
hard-codes (MiniCPM3-4B's config): embeddings x `scale_emb` 12, each residual branch x `scale_depth`
1.4 / sqrt(block_count), the final normed hidden state x `dim_model_base` 256 / n_embd before the
head. Attention is multi-head latent attention with a q LoRA and the unsplit `attn_kv_b`
(archrun-mla's legacy layout; `value_length` defaults to n_embd / n_head, llama.cpp's rule) whose
q_a/kv_a norms take HF's epsilon 1e-6 (`mla_fixed_lora_eps`; llama.cpp uses the model's, 1e-5 in the
released config); NEOX rope on the rope dims (HF's rotate_half), LongRoPE by the factor tensors (the
released model's original context equals its maximum: short factors, magnitude 1); SwiGLU.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

SCALE_EMB, SCALE_DEPTH, DIM_MODEL_BASE = 12.0, 1.4, 256.0  # llama.cpp's n_embd_base, scale_embd, scale_depth

HINTS = {
    "minicpm3": FamilyHints(name="minicpm3", rope_pairing="neox", activation="silu", embed_scale=SCALE_EMB,
                            residual_scale_depth=SCALE_DEPTH, logit_scale_base=DIM_MODEL_BASE,
                            **{**TRANSFORMER, "attention": "mla_fixed_lora_eps"}),
}

plugin = FamilyPlugin(HINTS)
