"""archrun family plugin for Falcon (`falcon`; Falcon-7B/40B/180B style; descriptions only, no math).

What falcon files do not say (llama.cpp src/models/falcon.cpp, HF modeling_falcon.py): attention
and MLP read the same input and their outputs are added to the block input together (parallel
residual, HF's parallel_attn); rope pairing NEOX (HF's rotate_half); the MLP is plain exact GELU;
embeddings not scaled. Falcon-7B blocks have one LayerNorm for both branches (no ffn_norm: the
parallel topology shares it). Q/K/V come fused in `attn_qkv` (the converter reorders Falcon's
grouped layout into [Q | K | V], noted by `tensor_data_layout = jploski`); multi-query (one K/V
head) is a head count.

The new decoder architecture (Falcon-40B/180B): llama.cpp's converter stores HF's ln_attn as
`attn_norm_2` and ln_mlp as `attn_norm`, and llama.cpp's falcon graph norms the attention input
with `attn_norm_2` when a block has it and the FFN input with `attn_norm`: the attention's norm
is the first of (`attn_norm_2`, `attn_norm`) the file has, the FFN's is `attn_norm` (in 7B files
the same weights as the attention's, so both branches read one norm as before).
Not described: Falcon-RW (ALiBi, sequential blocks: HF parallel_attn = false), which llama.cpp's
falcon graph does not run either (its files are refused at load, never run wrong).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "falcon": FamilyHints(
        name="falcon", rope_pairing="neox", activation="gelu", embed_scale=1.0,
        tensor_names={"attn_norm": ("blk.{i}.attn_norm_2.weight", "blk.{i}.attn_norm.weight"),
                      "attn_norm.bias": ("blk.{i}.attn_norm_2.bias", "blk.{i}.attn_norm.bias"),
                      "ffn_norm": "blk.{i}.attn_norm.weight", "ffn_norm.bias": "blk.{i}.attn_norm.bias"},
        **{**TRANSFORMER, "residual": "parallel"}),
}

plugin = FamilyPlugin(HINTS)
