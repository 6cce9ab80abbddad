"""archrun-dbrx's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("dbrx", synthetic=[
    Synthetic("dbrx_4experts_top2", "dbrx", seed=1, norm_key="layer", n_expert=4, n_expert_used=2,
              keys={"attention.clamp_kqv": 0.8}),
])
