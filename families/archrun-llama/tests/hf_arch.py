"""How llama.cpp's converter (``LlamaModel``) treats HF llama, and archrun-llama's tiny fixtures.

Used by ``archrun.conformance.hf``: ``tests/goldens/record.py`` records ``FIXTURES`` with it,
the tests rebuild and check them. llama.cpp permutes the Q/K rows so its NORM rope (adjacent
pairs) rotates the values HF's rotate_half rotates, and writes ``vocab_size`` and
``rope.dimension_count``.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _metadata(hp):
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    return {"add_vocab_size": hp["vocab_size"], "add_rope_dimension_count": head_dim}


LLAMA = HfArch("llama", "llama", "LlamaForCausalLM", "LlamaConfig",
               defaults={"num_hidden_layers": 2}, metadata=_metadata, permute_qk=True)

ARCHES = (LLAMA,)

FIXTURES = (
    TinyFixture("llama_gqa", "llama", 1),  # Q/K permutation with GQA
)
