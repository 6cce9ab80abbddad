"""archrun-exaone's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model of each architecture
the family describes and, through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("exaone", synthetic=[
    Synthetic("exaone3", "exaone", seed=3),
    Synthetic("exaone4", "exaone4"),
    Synthetic("exaone_moe_dense1_shared", "exaone-moe", seed=2, n_layer=3, qk_norm=True, n_expert=4, n_expert_used=2,
              n_shared=1, router_bias=True, leading_dense=1,
              keys={"expert_weights_norm": True, "expert_weights_scale": 2.5}),
])
