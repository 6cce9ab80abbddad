"""archrun-falcon-h1's tiny fixtures: HF FalconH1ForCausalLM converted by llama.cpp's own converter,
which folds Falcon-H1's multipliers into the weights (the fixtures give them values other than 1 so
the folding is seen)."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

FALCON_H1 = HfArch(
    "falcon-h1", "falcon_h1", "FalconH1ForCausalLM", "FalconH1Config", converter="llama.cpp",
    defaults={"num_hidden_layers": 3, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
              "mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 16,
              "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8, "mamba_rms_norm": False,
              "embedding_multiplier": 1.5, "lm_head_multiplier": 0.5, "attention_in_multiplier": 0.8,
              "attention_out_multiplier": 1.2, "key_multiplier": 0.7, "ssm_in_multiplier": 1.1,
              "ssm_out_multiplier": 0.9, "ssm_multipliers": [1.1, 0.9, 1.2, 0.8, 1.05], "mlp_multipliers": [0.9, 1.1]})

ARCHES = (FALCON_H1,)

FIXTURES = (
    # attention beside Mamba2 (one group, no gated norm) in every block
    TinyFixture("falcon_h1_g1", "falcon_h1", 1),
    # two groups, the gated grouped norm after the gate, 3 conv taps
    TinyFixture("falcon_h1_g2_norm", "falcon_h1", 2, {"mamba_n_groups": 2, "mamba_rms_norm": True,
                                                      "mamba_norm_before_gate": False, "mamba_d_conv": 3}),
)
