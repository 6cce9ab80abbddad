"""archrun-llama's fixtures converted by llama.cpp's own converter: HF MistralForCausalLM.

llama.cpp's converter writes MistralForCausalLM checkpoints as `general.architecture = llama`
(its LlamaModel: Q/K rows permuted for NORM rope), so mistral files are llama files to archrun.
llama.cpp's llama graph applies no sliding window: neither does archrun (the llama family states
no sliding layers), so the fixtures keep HF's window beyond their 40 tokens (Mistral-7B-v0.1's
4096) or none (v0.2 and later).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

MISTRAL = HfArch("llama", "mistral", "MistralForCausalLM", "MistralConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2})

ARCHES = (MISTRAL,)

FIXTURES = (
    TinyFixture("mistral_gqa_window4096", "llama", 1, {"sliding_window": 4096}),
    TinyFixture("mistral_hd32_tied_nowindow", "llama", 2,
                {"sliding_window": None, "head_dim": 32, "tie_word_embeddings": True, "num_hidden_layers": 3}),
)
