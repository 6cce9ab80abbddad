"""archrun-granitehybrid's tiny fixtures: HF GraniteMoeHybridForCausalLM converted by llama.cpp's
own converter. transformers names the layer kinds "linear_attention"/"full_attention"; released
Granite 4.0 configs (and the converter) say "mamba"/"attention": ``checkpoint_config`` writes them so.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _released_layer_types(hp):
    return {"layer_types": ["attention" if t == "full_attention" else "mamba" for t in hp["layer_types"]]}


def _dense_keys(hp):
    """A dense fixture keeps transformers' default num_experts_per_tok (2), which the converter writes
    as `expert_used_count` beside `expert_count` 0; llama.cpp's loader refuses that: say 0 there."""
    return {} if hp.get("num_local_experts") else {"expert_used_count": 0}


def _layers(kinds: str) -> dict:
    """layer_types from a string of m (Mamba2) / a (attention)."""
    return {"layer_types": ["full_attention" if k == "a" else "linear_attention" for k in kinds],
            "num_hidden_layers": len(kinds)}


GRANITEHYBRID = HfArch(
    "granitehybrid", "granitemoehybrid", "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
    converter="llama.cpp", checkpoint_config=_released_layer_types, llamacpp_keys=_dense_keys,
    defaults={"num_local_experts": 0, "shared_intermediate_size": 64, "mamba_n_heads": 8, "mamba_d_head": 16,
              "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
              "mamba_chunk_size": 8, "position_embedding_type": None, "embedding_multiplier": 2.0,
              "attention_multiplier": 0.2, "residual_multiplier": 0.5, "logits_scaling": 3.0, **_layers("mmam")})

ARCHES = (GRANITEHYBRID,)

FIXTURES = (
    # Mamba2, Mamba2, attention, Mamba2; dense shared MLP; granite's multipliers
    TinyFixture("granitehybrid_mmam_dense", "granitemoehybrid", 1),
    # experts (softmax top-2 of 4) plus the shared MLP; two groups; attention first
    TinyFixture("granitehybrid_amm_moe", "granitemoehybrid", 2, {
        "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 16, "shared_intermediate_size": 32,
        "mamba_n_groups": 2, "mamba_d_conv": 3, **_layers("amm")}),
)
