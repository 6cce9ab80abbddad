"""archrun-llama's fixtures converted by llama.cpp's own converter: HF MistralForCausalLM, LlamaForCausalLM
and InternLM3 (transformers runs it with its Llama implementation on an InternLM3Config).

The llama fixture carries every bias llama.cpp's llama graph reads (Q/K/V/O and the FFN's gate, up
and down: `attention_bias`, `mlp_bias`) and a head width that is not n_embd / n_head.

llama.cpp's converter writes MistralForCausalLM checkpoints as `general.architecture = llama`
(its LlamaModel: Q/K rows permuted for NORM rope), so mistral files are llama files to archrun.
llama.cpp's llama graph applies no sliding window: neither does archrun (the llama family states
no sliding layers), so the fixtures keep HF's window beyond their 40 tokens (Mistral-7B-v0.1's
4096) or none (v0.2 and later).

InternLM3 checkpoints name their class `InternLM3ForCausalLM`, which llama.cpp's converter writes as
llama (Q/K permuted like LlamaModel's): `checkpoint_config` gives the converter that name. The fixture
carries InternLM3-8B's rope: base 5e7 and dynamic NTK scaling x6, which the converter does not write
(llama.cpp and archrun rotate plain) and HF applies only beyond `max_position_embeddings` (32768
released, 256 in the fixture): the same logits within the fixture's 40 tokens, as within 32768 of a
released model's.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

MISTRAL = HfArch("llama", "mistral", "MistralForCausalLM", "MistralConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2})

LLAMA = HfArch("llama", "llama", "LlamaForCausalLM", "LlamaConfig", converter="llama.cpp",
               defaults={"num_hidden_layers": 2})

INTERNLM3 = HfArch("llama", "internlm3", "LlamaForCausalLM", "InternLM3Config", converter="llama.cpp",
                   defaults={"num_hidden_layers": 2, "rope_theta": 50_000_000.0},
                   rope_parameters=lambda kw: {"rope_type": "dynamic", "factor": 6.0,
                                               "rope_theta": kw.pop("rope_theta")},
                   checkpoint_config=lambda hp: {"architectures": ["InternLM3ForCausalLM"]})

ARCHES = (MISTRAL, LLAMA, INTERNLM3)

FIXTURES = (
    TinyFixture("mistral_gqa_window4096", "mistral", 1, {"sliding_window": 4096}),
    TinyFixture("mistral_hd32_tied_nowindow", "mistral", 2,
                {"sliding_window": None, "head_dim": 32, "tie_word_embeddings": True, "num_hidden_layers": 3}),
    TinyFixture("llama_all_biases_hd32", "llama", 3, {"mlp_bias": True, "attention_bias": True, "head_dim": 32}),
    # InternLM3-8B-style grouped K/V heads (the 8B: 32 query heads over 2), here 16 over 2, head width 32
    TinyFixture("internlm3_gqa8_hd32", "internlm3", 1, {"num_attention_heads": 16, "num_key_value_heads": 2,
                                                        "head_dim": 32, "hidden_size": 64}),
)
