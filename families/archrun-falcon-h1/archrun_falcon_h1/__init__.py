"""archrun family plugin for falcon-h1 (descriptions only, no math).

What falcon-h1 files do not say (llama.cpp src/models/falcon-h1.cpp, HF modeling_falcon_h1.py):
every block runs causal attention (NEOX rope) and a Mamba2 mixer ("mamba2", from the
archrun-recurrent vocabulary package; `ssm_a`/`ssm_d` stored without `.weight`) side by side on the
same normed input and adds their outputs; then a SwiGLU FFN (its norm stored as `ffn_norm` without
`.weight`). Falcon-H1's multipliers (embedding,
attention in/out, key, SSM in/out and per-part SSM, MLP, LM head) are folded into the weights by the
converter.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "falcon-h1": FamilyHints(name="falcon-h1", rope_pairing="neox", activation="silu", embed_scale=1.0,
                             parallel="mamba2", tensor_names={"ssm_a": "blk.{i}.ssm_a", "ssm_d": "blk.{i}.ssm_d",
                                           "ffn_norm": "blk.{i}.ffn_norm"},
                             **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
