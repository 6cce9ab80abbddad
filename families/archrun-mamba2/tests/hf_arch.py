"""archrun-mamba2's tiny fixtures: HF Mamba2ForCausalLM converted by llama.cpp's own converter
(A = -exp(A_log), conv1d squeezed to {K, conv_dim}, the gated norm's weight as {d_inner/G, G})."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

MAMBA2 = HfArch("mamba2", "mamba2", "Mamba2ForCausalLM", "Mamba2Config", converter="llama.cpp",
                defaults={"num_hidden_layers": 3, "hidden_size": 64, "expand": 2, "intermediate_size": 128,
                          "num_heads": 8, "head_dim": 16, "state_size": 16, "n_groups": 1, "conv_kernel": 4,
                          "layer_norm_epsilon": 1e-5, "chunk_size": 8, "use_conv_bias": True, "use_bias": False})

ARCHES = (MAMBA2,)

FIXTURES = (
    # one group, 4 conv taps, untied head
    TinyFixture("mamba2_g1_k4", "mamba2", 1),
    # two groups (heads 0-3 read group 0), 3 taps, tied head, wider state
    TinyFixture("mamba2_g2_k3_tied", "mamba2", 2, {"n_groups": 2, "conv_kernel": 3, "state_size": 24,
                                                   "tie_word_embeddings": True}),
    # fewer, wider heads, four groups, two layers
    TinyFixture("mamba2_g4_hd32", "mamba2", 3, {"num_heads": 4, "head_dim": 32, "n_groups": 4,
                                                "num_hidden_layers": 2}),
)
