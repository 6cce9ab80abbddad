"""archrun-olmo's tests: archrun's conformance kit (docs/conformance.md) on synthetic olmo, olmo2 and
olmoe models and, through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("olmo", synthetic=[
    Synthetic("olmo", "olmo", seed=1, norm_key="layer"),
    # OLMo 2 has no pre-norms: its sublayer outputs are normed (post norms) before they join the stream
    Synthetic("olmo2_post_norms", "olmo2", seed=2, post_norms=True, qk_norm=True),
    Synthetic("olmoe_top2", "olmoe", seed=3, qk_norm=True, n_expert=4, n_expert_used=2),
])
