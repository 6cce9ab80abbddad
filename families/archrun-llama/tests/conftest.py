"""archrun-llama's tests: archrun's conformance kit (docs/conformance.md) on synthetic llama variants and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("llama", synthetic=[
    Synthetic("llama_gqa", "llama", seed=1),
    Synthetic("llama_mqa_tied_biases", "llama", seed=2, n_head_kv=1, tied=True, qkv_bias=True, n_layer=3),
])
