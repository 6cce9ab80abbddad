"""archrun-glm4moe's tests: archrun's conformance kit (docs/conformance.md) on synthetic glm4moe variants
(sigmoid router with selection bias, shared experts, leading dense layers, partial rope) and, through
hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("glm4moe", synthetic=[
    Synthetic("glm4moe_shared_dense1", "glm4moe", seed=1, n_layer=3, qkv_bias=True, n_rot=8, n_expert=4,
              n_expert_used=2, n_shared=1, router_bias=True, leading_dense=1, gating_func=2,
              keys={"expert_weights_norm": True, "expert_weights_scale": 2.5}),
    Synthetic("glm4moe_qk_norm_tied", "glm4moe", seed=2, n_layer=2, qk_norm=True, tied=True, n_rot=16,
              n_expert=8, n_expert_used=3, router_bias=True, gating_func=2,
              keys={"expert_weights_norm": False, "expert_group_count": 4, "expert_group_used_count": 2}),
])
