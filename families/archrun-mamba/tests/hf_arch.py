"""archrun-mamba's tiny fixtures: HF MambaForCausalLM and FalconMambaForCausalLM, both converted by llama.cpp's
own converter to `mamba` (A = -exp(A_log), conv1d squeezed to {K, d_inner}; Falcon-Mamba sets
`ssm.dt_b_c_rms`). The converter requires d_inner = 2 d_model (expand 2)."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

_COMMON = {"num_hidden_layers": 3, "hidden_size": 64, "expand": 2, "intermediate_size": 128, "state_size": 16,
           "conv_kernel": 4, "time_step_rank": 4, "layer_norm_epsilon": 1e-5, "use_conv_bias": True,
           "use_bias": False, "pad_token_id": None}

MAMBA = HfArch("mamba", "mamba", "MambaForCausalLM", "MambaConfig", converter="llama.cpp", defaults=_COMMON)
FALCON_MAMBA = HfArch("mamba", "falcon_mamba", "FalconMambaForCausalLM", "FalconMambaConfig",
                      converter="llama.cpp", defaults=_COMMON)

ARCHES = (MAMBA, FALCON_MAMBA)

FIXTURES = (
    # Mamba (state-spaces/mamba-*-hf settings scaled down): dt rank ceil(d/16), 4 taps, tied head
    TinyFixture("mamba_k4_tied", "mamba", 1, {"tie_word_embeddings": True}),
    # Mamba with 3 taps, a wider state and an untied head
    TinyFixture("mamba_k3_n24", "mamba", 2, {"conv_kernel": 3, "state_size": 24, "time_step_rank": 8}),
    # Falcon-Mamba (weightless RMS norms on dt, B, C; tiiuae/falcon-mamba-7b: untied, 4 taps)
    TinyFixture("falcon_mamba_k4", "falcon_mamba", 3),
)
