"""archrun family plugin for bitnet (BitNet b1.58: microsoft/bitnet-b1.58-2B-4T; descriptions only, no math).

What bitnet files do not say (HF modeling_bitnet.py with transformers' BitNet quantization, llama.cpp
src/models/bitnet.cpp): llama.cpp's converter stores the projections already ternary ({-s, 0, s}
per tensor, s the mean magnitude) as float tensors; HF's eval mode quantizes each projection's input
per token to int8 by its absmax, and every such input is a norm's output, so the blocks' norm is
"rms_act8" (archrun-blocks: RMSNorm, then int8 per row) while the final norm, which feeds the float
head, is plain "rms" (`final_norm`). The sub-layer norms before the attention output and the FFN's
down projection are the file's `attn_sub_norm` / `ffn_sub_norm` (by presence). NEOX rope (HF's
rotate_half; the converter does not permute); squared-ReLU gated FFN (2B-4T's `relu2`; the older
1bitLLM files use SiLU: `--hint activation=silu`).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "bitnet": FamilyHints(name="bitnet", rope_pairing="neox", activation="relu2", embed_scale=1.0,
                          norm="rms_act8", final_norm="rms", **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
