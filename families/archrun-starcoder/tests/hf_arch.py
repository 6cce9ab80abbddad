"""archrun-starcoder's tiny fixtures: HF GPTBigCodeForCausalLM, converted by llama.cpp's own converter.

llama.cpp's converter writes one K/V head and an FFN of 4 x n_embd whatever the config says: the
fixtures are multi-query with the default inner width, as the released StarCoder/SantaCoder models.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

STARCODER = HfArch("starcoder", "gpt_bigcode", "GPTBigCodeForCausalLM", "GPTBigCodeConfig", converter="llama.cpp",
                   defaults={"num_hidden_layers": 2, "n_positions": 256, "layer_norm_epsilon": 1e-5,
                             "multi_query": True, "intermediate_size": None})

ARCHES = (STARCODER,)

FIXTURES = (
    TinyFixture("starcoder_mqa_tied", "starcoder", 1, {"tie_word_embeddings": True}),
    TinyFixture("starcoder_mqa_8head", "starcoder", 2, {"tie_word_embeddings": False, "num_attention_heads": 8}),
)
