"""archrun family plugin for deepseek4 (DeepSeek-V4; descriptions only, no math).

What deepseek4 files do not say (llama.cpp src/models/deepseek4.cpp, HF modeling_deepseek_v4.py): the
residual stream is `hyper_connection.count` hyper-connected streams ("mhc", archrun-deepseek4-ops),
mixed around every attention and FFN branch and collapsed by the head before the final norm; attention is
V4's own ("deepseek4", archrun-deepseek4-ops: q LoRA, one shared K=V head roped on its trailing dims by the
op itself, so the model's rope table rotates nothing, sinks, the sliding window, the grouped low-rank
output, and the compressed entries of CSA / HCA layers by `attention.compress_ratios`); experts are
clamped SwiGLU ("swiglu_clamp", the file's per-layer `swiglu_clamp_exp`) scored by sqrt-softplus (the
file's expert_gating_func 4), renormalised and scaled, plus a shared expert; the first
`hash_layer_count` layers (those with a `ffn_gate_tid2eid` table) pick their experts by token id
("hash_topk", archrun-deepseek4-ops), the others top-k with a selection bias.

The installed gguf-py (0.19) spells none of V4's own keys and tensors: the family declares them
(FamilyHints.metadata_keys, tensor_roles) as llama.cpp's gguf-py names them.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

#: llama.cpp's DeepSeek-V4 keys (gguf-py Keys.LLM / Attention / HyperConnection) archrun's gguf-py lacks
METADATA_KEYS = (
    "{arch}.embedding_length_out", "{arch}.hash_layer_count", "{arch}.swiglu_clamp_exp", "{arch}.swiglu_clamp_shexp",
    "{arch}.attention.output_group_count", "{arch}.attention.output_lora_rank", "{arch}.attention.compress_ratios",
    "{arch}.attention.compress_rope_freq_base", "{arch}.hyper_connection.count",
    "{arch}.hyper_connection.sinkhorn_iterations", "{arch}.hyper_connection.epsilon",
    "{arch}.hyper_connection.magnitude", "{arch}.hyper_connection.low_rank",
)

#: llama.cpp's DeepSeek-V4 tensors (gguf-py TENSOR_NAMES) archrun's gguf-py lacks, by role
TENSOR_ROLES = {
    **{f"hc_{b}_{p}": f"blk.{{i}}.hc_{b}_{p}.weight" for b in ("attn", "ffn") for p in ("fn", "base", "scale")},
    **{f"output_hc_{p}": f"output_hc_{p}.weight" for p in ("fn", "base", "scale")},
    "attn_kv": "blk.{i}.attn_kv.weight",
    "attn_output_a": "blk.{i}.attn_output_a.weight",
    "attn_output_b": "blk.{i}.attn_output_b.weight",
    **{f"{w}_compressor_{p}": f"blk.{{i}}.{w}_compressor_{p}.weight" for w in ("attn", "indexer")
       for p in ("kv", "gate", "ape", "norm")},
    "ffn_gate_tid2eid": "blk.{i}.ffn_gate_tid2eid.weight",
}

HINTS = {
    "deepseek4": FamilyHints(name="deepseek4", rope_pairing="none", activation="swiglu_clamp", embed_scale=1.0,
                             stream="mhc", metadata_keys=METADATA_KEYS, tensor_roles=TENSOR_ROLES,
                             **{**TRANSFORMER, "attention": "deepseek4", "moe": "hash_topk"}),
}

plugin = FamilyPlugin(HINTS)
