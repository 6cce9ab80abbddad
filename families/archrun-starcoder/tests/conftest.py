"""archrun-starcoder's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("starcoder", synthetic=[
    Synthetic("starcoder_mqa", "starcoder", seed=1, n_head=4, n_head_kv=1, norm_key="layer", qkv_bias=True),
])
