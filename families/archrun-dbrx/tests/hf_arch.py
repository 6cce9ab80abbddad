"""archrun-dbrx's tiny fixtures: HF DbrxForCausalLM, converted by llama.cpp's own converter.

DBRX's settings live in nested `attn_config` / `ffn_config`; `rope_theta` sits inside
`attn_config` (where HF's attention and llama.cpp's converter read it) and, the same value, in
`rope_parameters` (HF's rotary embedding). The released model: 16 experts, top 4,
`clip_qkv` 8, 8 K/V heads of 48, rope base 500000; the fixtures keep top-k of half the experts,
grouped K/V heads and a clip small enough to bite on tiny random activations.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

ROPE_THETA = 500000.0


def _attn(kv_heads: int, clip: float) -> dict:
    return {"kv_n_heads": kv_heads, "clip_qkv": clip, "rope_theta": ROPE_THETA}


def _ffn(n_expert: int, top_k: int, n_ff: int = 32) -> dict:
    return {"ffn_hidden_size": n_ff, "moe_num_experts": n_expert, "moe_top_k": top_k}


DBRX = HfArch("dbrx", "dbrx", "DbrxForCausalLM", "DbrxConfig", converter="llama.cpp",
              defaults={"num_hidden_layers": 2, "rope_theta": ROPE_THETA, "attn_config": _attn(2, 0.8),
                        "ffn_config": _ffn(4, 2)},
              # DbrxConfig copies d_model into ffn_config before it applies attribute-mapped kwargs
              config_renames={"hidden_size": "d_model", "num_attention_heads": "n_heads",
                              "num_hidden_layers": "n_layers", "max_position_embeddings": "max_seq_len"})

ARCHES = (DBRX,)

FIXTURES = (
    TinyFixture("dbrx_4experts_top2", "dbrx", 1),
    TinyFixture("dbrx_8experts_top4_mqa", "dbrx", 2, {"attn_config": _attn(1, 1.5), "ffn_config": _ffn(8, 4, 16),
                                                         "num_attention_heads": 8}),
)
