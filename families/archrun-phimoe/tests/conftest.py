"""archrun-phimoe's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("phimoe", synthetic=[
    Synthetic("phimoe_4experts_top2", "phimoe", seed=1, norm_key="layer", qkv_bias=True, n_expert=4,
              n_expert_used=2),
])
