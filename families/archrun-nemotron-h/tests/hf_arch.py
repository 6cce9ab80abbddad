"""archrun-nemotron-h's tiny fixtures: HF NemotronHForCausalLM converted by llama.cpp's own converter.

Released Nemotron-H configs (Nemotron-H-8B/47B/56B) state their layers as `hybrid_override_pattern`
(M: Mamba2, *: attention, -: MLP) and carry no mixture-of-experts fields; transformers 5 saves every
field of its config (`num_experts_per_tok` among them, which makes llama.cpp's converter write the
MoE architecture) and the tiny defaults' `rms_norm_eps` (which the converter would write as the RMS
epsilon: released configs have only `layer_norm_epsilon`), so ``checkpoint_config`` writes the config
as those checkpoints have it.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

_KIND = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
_NOT_RELEASED = ("rms_norm_eps", "num_experts_per_tok", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
               "moe_shared_expert_intermediate_size", "moe_latent_size", "moe_shared_expert_overlap",
               "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob", "layers_block_type")


def _released(hp):
    pattern = "".join({v: k for k, v in _KIND.items()}[t] for t in hp["layers_block_type"])
    return {"hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern), **{k: None for k in _NOT_RELEASED}}


def _pattern(p: str) -> dict:
    return {"layers_block_type": [_KIND[c] for c in p]}


NEMOTRON_H = HfArch(
    "nemotron_h", "nemotron_h", "NemotronHForCausalLM", "NemotronHConfig", converter="llama.cpp",
    checkpoint_config=_released,
    defaults={"head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 96,
              "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4,
              "expand": 2, "chunk_size": 8, "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2",
              **_pattern("M-M*-M-")})

ARCHES = (NEMOTRON_H,)

FIXTURES = (
    # Nemotron-H-8B's settings scaled down: Mamba2 / MLP alternation with one attention layer (NoPE,
    # 4 query heads per KV head), 8 Mamba2 heads of 16 in 2 groups (expand 2), squared-ReLU MLPs
    TinyFixture("nemotron_h_8b_pattern", "nemotron_h", 1),
    # Nemotron-Nano-9B-v2's kinds of runs: attention first and twice, Mamba2 twice in a row; 4 groups
    # of 2 heads, state 8, multi-head attention
    TinyFixture("nemotron_h_nano_pattern", "nemotron_h", 2, {
        "n_groups": 4, "ssm_state_size": 8, "num_key_value_heads": 4, **_pattern("*-MM-*M")}),
)
