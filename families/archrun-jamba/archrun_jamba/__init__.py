"""archrun family plugin for jamba (descriptions only, no math).

What jamba files do not say (llama.cpp src/models/jamba.cpp, HF modeling_jamba.py): layers whose
per-layer `attention.head_count_kv` is 0 are Mamba mixers ("mamba", from the archrun-recurrent
vocabulary package, with RMS norms on dt, B and C; `ssm_a`/`ssm_d` stored without `.weight`), the
others causal attention without any position encoding; FFNs are SwiGLU, dense or a softmax top-k
mixture whose chosen weights are not renormalised.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "jamba": FamilyHints(name="jamba", rope_pairing="none", activation="silu", embed_scale=1.0, gating="softmax",
                         recurrent="mamba", tensor_names={"ssm_a": "blk.{i}.ssm_a", "ssm_d": "blk.{i}.ssm_d"},
                         **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
