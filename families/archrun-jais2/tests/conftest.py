"""archrun-jais2's tests: archrun's conformance kit (docs/conformance.md) on a synthetic jais2 model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("jais2", synthetic=[
    Synthetic("jais2_layernorm_bias", "jais2", seed=1, qkv_bias=True, norm_key="layer"),
])
