"""archrun-llama's fixtures converted by llama.cpp's own converter: HF MistralForCausalLM, LlamaForCausalLM.

The llama fixture carries every bias llama.cpp's llama graph reads (Q/K/V/O and the FFN's gate, up
and down: `attention_bias`, `mlp_bias`) and a head width that is not n_embd / n_head.

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

LLAMA = HfArch("llama", "llama", "LlamaForCausalLM", "LlamaConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2})

ARCHES = (MISTRAL, LLAMA)

FIXTURES = (
    TinyFixture("mistral_gqa_window4096", "mistral", 1, {"sliding_window": 4096}),
    TinyFixture("mistral_hd32_tied_nowindow", "mistral", 2,
                {"sliding_window": None, "head_dim": 32, "tie_word_embeddings": True, "num_hidden_layers": 3}),
    TinyFixture("llama_all_biases_hd32", "llama", 3, {"mlp_bias": True, "attention_bias": True, "head_dim": 32}),
)
