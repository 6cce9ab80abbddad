"""archrun-minimax's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("minimax", synthetic=[
    Synthetic("minimax_m2_sigmoid_bias", "minimax-m2", seed=1, n_rot=8, n_expert=4, n_expert_used=2,
              router_bias=True, gating_func=2),
])
