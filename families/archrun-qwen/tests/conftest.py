"""archrun-qwen's tests: archrun's conformance kit (docs/conformance.md) on synthetic qwen2/qwen3/qwen3moe
variants and, through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("qwen", synthetic=[
    Synthetic("qwen2_qkv_bias", "qwen2", seed=1, qkv_bias=True),
    Synthetic("qwen3_qk_norm_tied", "qwen3", seed=2, qk_norm=True, tied=True, n_head_kv=1),
    Synthetic("qwen3moe_top2", "qwen3moe", seed=3, qk_norm=True, n_expert=4, n_expert_used=2),
])
