"""archrun family plugin for deepseek32 (DeepSeek-V3.2; descriptions only, no math).

What deepseek32 files do not say (llama.cpp src/models/deepseek32.cpp, HF modeling_deepseek_v32.py):
attention is DeepSeek Sparse Attention ("mla_dsa", from the archrun-mla vocabulary package):
DeepSeek-V3's multi-head latent attention whose keys are the top-k a lightning indexer picks per
query (the file's `indexer.*` tensors and `attention.indexer.*` keys), its q_a/kv_a norms at HF's
epsilon 1e-6; rope NORM pairing (HF's interleaved rope) on the qk_rope dims of the attention and NEOX
(HF's rotate_half) on the indexer's, both on the model's rope table; SwiGLU; leading dense layers,
then MoE with shared experts, gated as the file's expert_gating_func says (sigmoid with a selection
bias in the released model). YaRN as deepseek2: rotary magnitude 1, the scores take mscale^2.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.text.reasoning import THINK_TAGS

HINTS = {
    "deepseek32": FamilyHints(name="deepseek32", rope_pairing="norm", activation="silu", embed_scale=1.0,
                              gating="softmax", gating_biased="sigmoid", **{**TRANSFORMER, "attention": "mla_dsa"},
                              defaults={"rope.scaling.yarn_attn_factor": 1.0}),
}

plugin = FamilyPlugin(HINTS, reasoning=THINK_TAGS)
