"""archrun-hunyuan's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model of each architecture
the family describes and, through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("hunyuan-dense", synthetic=[
    Synthetic("hunyuan-dense", "hunyuan-dense"),
    Synthetic("hunyuan_moe_shared", "hunyuan-moe", seed=2, qk_norm=True, n_expert=4, n_expert_used=2, n_shared=1),
])
