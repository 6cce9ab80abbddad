"""archrun family plugin for Microsoft Phi-2 (`phi2`) and Phi-3 / Phi-4-mini (`phi3`); descriptions only, no math.

phi2 (llama.cpp src/models/phi2.cpp, HF modeling_phi.py): one LayerNorm per block feeds both the
attention and the MLP, whose outputs are added to the block input together (parallel residual;
the shared norm is found by the absent ffn_norm); rope pairing NEOX on the first
rope.dimension_count dims (partial rope); the MLP is plain GELU with the tanh approximation (HF's
gelu_new); every projection and the output head carry biases (by tensor presence). llama.cpp's
converter writes head_count_kv = head_count: phi2 has no GQA.

phi3 (llama.cpp src/models/phi3.cpp, HF modeling_phi3.py): Q/K/V fused in `attn_qkv` and gate|up
packed in one `ffn_up` (both found by shape); SwiGLU (SiLU); rope pairing NEOX, partial when
rope.dimension_count says so; LongRoPE by the rope_factors_long/short tensors and
rope.scaling.attn_factor; sequential pre-RMSNorm blocks. Like llama.cpp, archrun applies no
sliding window to phi3 files (`attention.sliding_window` is read but no layer is sliding).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "phi2": FamilyHints(name="phi2", rope_pairing="neox", activation="gelu_tanh", embed_scale=1.0,
                        **{**TRANSFORMER, "residual": "parallel"}),
    "phi3": FamilyHints(name="phi3", rope_pairing="neox", activation="silu", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
