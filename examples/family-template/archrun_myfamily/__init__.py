"""archrun family plugin for MYARCH (template: descriptions only, never math).

A family states what an architecture's GGUF files do not say (its *conventions*,
archrun.family.CONVENTIONS); everything else (dims, heads, epsilons, rope base and scaling,
which tensors exist, biases, QK norms, MoE shape...) the compiler reads from the file.
Write here, for the next reader, where each choice comes from (llama.cpp's
src/models/<arch>.cpp, HF's modeling_<arch>.py).

Check the result with `archrun inspect MODEL.gguf` (the descriptor and which plugin provides each
op) and against a reference implementation (docs/testing.md: tiny HF fixtures).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

# FILL IN: the file's `general.architecture` string (its keys are then "<arch>.embedding_length", ...).
ARCHITECTURE = "myarch"

HINTS = {
    ARCHITECTURE: FamilyHints(
        name=ARCHITECTURE,
        # FILL IN: which dims the rotary embedding pairs: "norm" (x[2i], x[2i+1]; llama.cpp LLAMA_ROPE_TYPE_NORM)
        # or "neox" (x[i], x[i + n_rot/2]; LLAMA_ROPE_TYPE_NEOX).
        rope_pairing="neox",
        # FILL IN: the FFN activation (gated: act(gate) * up): "silu", "gelu_tanh", "gelu", "relu2", or an op
        # of another vocabulary plugin (see examples/archrun-example-vocab: "gelu_quick").
        activation="silu",
        # FILL IN: the token-embedding multiplier: 1.0, a number, or "sqrt_n_embd" (Gemma).
        embed_scale=1.0,
        # OPTIONAL, remove what you do not need:
        # norm="layer",                      # when the file's epsilon key does not say it
        # residual="parallel",               # attention and FFN both read the block input (TRANSFORMER: sequential)
        # gating="sigmoid",                  # MoE router when the file has no expert_gating_func
        # residual_scale=..., logit_scale=...,
        # swa_period=6,                      # layer i sliding iff i % 6 < 5 (without sliding_window_pattern)
        # nope_period=4,                     # every 4th layer without rotary embedding
        # defaults={"rope.freq_base": 10000.0},        # values for keys (without the "<arch>." prefix) files omit
        # tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight"},  # tensor roles under other names
        # chat_template="...",               # a Jinja template when files carry none
        # block_style="host_reference",
        # the choices every decoder-only transformer so far shares (causal attention, sequential blocks,
        # top-k MoE, tanh softcap); override a key above to differ
        **TRANSFORMER,
    ),
}

# `plugin` implements the family hooks (archrun_describe_family, archrun_families); one package may
# describe several architectures: add entries to HINTS.
plugin = FamilyPlugin(HINTS)
