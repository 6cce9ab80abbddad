"""archrun family plugin for GLM-4 dense (`glm4`; GLM-4-0414 and later; descriptions only, no math).

What glm4 files do not say (llama.cpp src/models/glm4.cpp, HF modeling_glm4.py): rope pairing
NORM (HF's interleaved rotate_half_llm: adjacent pairs) on the first rope.dimension_count dims
of each head (partial rope, HF's partial_rotary_factor); SwiGLU (SiLU) with gate|up packed in one
`ffn_up` tensor; sequential pre-RMSNorm blocks with sandwich norms (`post_attention_norm` after
the attention, `post_ffw_norm` after the FFN — found by tensor presence); embeddings not scaled.
Q/K/V biases (attention_bias) are found by tensor presence.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "glm4": FamilyHints(name="glm4", rope_pairing="norm", activation="silu", embed_scale=1.0, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
