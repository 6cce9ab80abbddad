"""archrun-kimi-linear's tiny fixtures: HF KimiLinearForCausalLM converted by llama.cpp's own converter
(which writes -exp(A_log) as `ssm_a`, the KDA head width as `kda.head_dim`, a per-layer
`attention.head_count_kv` that is 0 on KDA layers, splits kv_b_proj into attn_k_b / attn_v_b and
stacks the experts).

Released Kimi-Linear configs carry fields transformers 5 no longer writes: `linear_attn_config`
(the 1-based full-attention and KDA layer lists, head width, conv taps), the sigmoid router
(`moe_router_activation_func`), `first_k_dense_replace`; ``checkpoint_config`` adds them back for
the converter, from the config HF ran; ``checkpoint_renames`` puts the leading dense layers' MLP
back under `mlp.` (transformers' save files it under the MoE's `block_sparse_moe.`).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _checkpoint(hp):
    layers = hp["layer_types"]
    dense = sum(kind == "dense" for kind in hp["mlp_layer_types"])
    return {"linear_attn_config": {
                "full_attn_layers": [i + 1 for i, kind in enumerate(layers) if kind == "full_attention"],
                "kda_layers": [i + 1 for i, kind in enumerate(layers) if kind == "linear_attention"],
                "head_dim": hp["linear_head_dim"], "num_heads": hp["linear_num_heads"],
                "short_conv_kernel_size": hp["linear_conv_kernel_dim"]},
            "moe_router_activation_func": "sigmoid", "first_k_dense_replace": dense,
            "num_shared_experts": hp.get("num_shared_experts", hp.get("n_shared_experts"))}


def _layers(pattern: str) -> dict:
    """HF layer types of a pattern of K (KDA) and M (MLA) layers; the first MLP dense, MoE after
    (the released model's first_k_dense_replace 1)."""
    return {"num_hidden_layers": len(pattern),
            "layer_types": ["full_attention" if c == "M" else "linear_attention" for c in pattern],
            "mlp_layer_types": ["dense"] + ["sparse"] * (len(pattern) - 1)}


# Kimi-Linear-48B-A3B scaled down: as many KDA heads as MLA heads (llama.cpp reads both from
# attention.head_count), KDA head width = qk_nope, MLA without a q LoRA, no rope on the rope dims,
# 4 conv taps, sigmoid routing over one expert group, renormalised, x2.446, one shared expert.
KIMI_LINEAR = HfArch(
    "kimi-linear", "kimi_linear", "KimiLinearForCausalLM", "KimiLinearConfig", converter="llama.cpp",
    defaults={"num_attention_heads": 4, "num_key_value_heads": 4, "linear_num_heads": 4, "linear_head_dim": 16,
              "linear_conv_kernel_dim": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 8,
              "qk_nope_head_dim": 16, "v_head_dim": 16, "num_local_experts": 8, "num_experts_per_tok": 2,
              "moe_intermediate_size": 16, "n_shared_experts": 1, "routed_scaling_factor": 2.446,
              "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "rms_norm_eps": 1e-5, "pad_token_id": None,
              **_layers("KKKM")},
    checkpoint_config=_checkpoint,
    # transformers saves the dense MLP of the leading layers under the MoE's prefix too
    checkpoint_renames={r"\.block_sparse_moe\.((?:gate|up|down)_proj)\.": r".mlp.\1."})

ARCHES = (KIMI_LINEAR,)

FIXTURES = (
    # KDA, KDA, KDA, MLA (the released 3:1 pattern)
    TinyFixture("kimi_linear_kkkm", "kimi_linear", 1),
    # MLA first, two KDA layers with 3 conv taps and wider heads, MLA last; 3 of 8 experts, 2 shared
    TinyFixture("kimi_linear_mkkm_k3", "kimi_linear", 2, {
        **_layers("MKKM"), "linear_conv_kernel_dim": 3, "linear_head_dim": 24, "num_experts_per_tok": 3,
        "n_shared_experts": 2, "routed_scaling_factor": 1.5}),
)
