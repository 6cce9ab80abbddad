"""How llama.cpp's converter (``Qwen2Model``, ``Qwen3Model``, ``Qwen3MoeModel``) treats HF qwen2,
qwen3 and qwen3_moe, and archrun-qwen's tiny fixtures.

Used by ``archrun.conformance.hf``: ``tests/goldens/record.py`` records ``FIXTURES`` with it,
the tests rebuild and check them. ``key_length``/``value_length`` are written only when the
config has ``head_dim`` (qwen3, qwen3moe; not qwen2).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

QWEN3 = HfArch("qwen3", "qwen3", "Qwen3ForCausalLM", "Qwen3Config",
               defaults={"num_hidden_layers": 3, "head_dim": 32})
QWEN3MOE = HfArch(
    "qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
    defaults={"num_hidden_layers": 2, "head_dim": 16, "moe_intermediate_size": 32,
              "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True},
    metadata=lambda hp: {"add_expert_feed_forward_length": hp["moe_intermediate_size"]},
    config_renames={"num_experts": "num_local_experts"},  # transformers 5's name
)
QWEN2 = HfArch("qwen2", "qwen2", "Qwen2ForCausalLM", "Qwen2Config", defaults={"num_hidden_layers": 2})

ARCHES = (QWEN3, QWEN3MOE, QWEN2)

FIXTURES = (
    # qwen3: head_dim != n_embd/n_head, random q/k norms; tied and untied; GQA, MQA, MHA
    TinyFixture("qwen3_untied_hd32", "qwen3", 1),
    TinyFixture("qwen3_tied_kv1", "qwen3", 2, {"tie_word_embeddings": True, "num_key_value_heads": 1, "head_dim": 16}),
    TinyFixture("qwen3_tied_mha_hd24", "qwen3", 3,
                {"tie_word_embeddings": True, "num_key_value_heads": 4, "head_dim": 24,
                 "num_hidden_layers": 2, "rope_theta": 1_000_000.0}),
    # qwen3moe: softmax router, norm_topk_prob=True as released models use
    TinyFixture("qwen3moe_untied", "qwen3moe", 1),
    TinyFixture("qwen3moe_tied_top3", "qwen3moe", 2,
                {"tie_word_embeddings": True, "num_experts_per_tok": 3, "num_key_value_heads": 1,
                 "moe_intermediate_size": 16, "num_hidden_layers": 3}),
    # qwen3 with every bias transformers offers (attention_bias: q/k/v and o): HF is the only reference
    TinyFixture("qwen3_attention_bias", "qwen3", 4, {"attention_bias": True, "num_hidden_layers": 2},
                llama_cpp="llama.cpp's qwen3 loader takes no attention biases (wrong tensor count)"),
    # qwen2: q/k/v biases (llama.cpp's qwen3 loads no attention biases, so attention_bias stays
    # False there)
    TinyFixture("qwen2_gqa", "qwen2", 1),
)
