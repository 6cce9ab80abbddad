"""archrun-falcon's tiny fixtures: HF FalconForCausalLM, converted by llama.cpp's own converter.

llama.cpp's converter writes feed_forward_length = 4 * hidden_size (FalconConfig's default
ffn_hidden_size) and a fixed context_length of 2048. It reads the K/V head count from
`num_kv_heads` (default 1: multi-query); transformers' FalconConfig writes num_kv_heads =
num_attention_heads when it is unset, so the fixtures state 1 as Falcon-7B means it. The
converter cannot convert linear biases (HF bias = true: it reshapes the fused Q/K/V bias as a
matrix and fails), so no fixture has them; Falcon-7B/40B/180B have none.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

FALCON = HfArch("falcon", "falcon", "FalconForCausalLM", "FalconConfig", converter="llama.cpp",
                defaults={"num_hidden_layers": 2, "layer_norm_epsilon": 1e-5, "parallel_attn": True,
                          "alibi": False, "bias": False, "multi_query": True, "num_kv_heads": 1,
                          "new_decoder_architecture": False})

ARCHES = (FALCON,)

FIXTURES = (
    # Falcon-7B style: multi-query (one K/V head), one LayerNorm per block
    TinyFixture("falcon_mqa", "falcon", 1),
    TinyFixture("falcon_mqa_tied_8head", "falcon", 2, {"tie_word_embeddings": True, "num_attention_heads": 8}),
    # Falcon-40B style: the new decoder architecture (two LayerNorms per block, grouped K/V heads)
    TinyFixture("falcon_new_decoder_gqa", "falcon", 3, {"new_decoder_architecture": True, "multi_query": False,
                                                        "num_kv_heads": 2}),
)
