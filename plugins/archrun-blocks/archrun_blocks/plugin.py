"""Registers archrun-blocks' vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

import pluggy

from archrun.vocab import Op
from archrun_blocks import fast, reference

hookimpl = pluggy.HookimplMarker("archrun")


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("norm", "rms", reference.rms_norm, fast.rms_norm, "RMSNorm over the last axis"))
    register(Op("rope", "neox", reference.rope_neox, fast.rope_neox, "rotate (x[i], x[i+n_rot/2])"))
    register(Op("rope", "norm", reference.rope_norm, fast.rope_norm, "rotate (x[2i], x[2i+1])"))
    register(Op("attention", "causal", reference.CausalAttention, fast.causal_attention,
                "causal grouped-query attention, optional sliding window mask, plain KV slot"))
    register(Op("ffn", "swiglu", reference.swiglu, fast.swiglu, "silu(gate) * up"))
    register(Op("ffn", "geglu_tanh", reference.geglu_tanh, fast.geglu_tanh, "gelu_tanh(gate) * up"))
    register(Op("gating", "softmax", reference.gating_softmax, fast.gating_softmax, "softmax over experts (GGUF 1)"))
    register(Op("gating", "sigmoid", reference.gating_sigmoid, fast.gating_sigmoid, "sigmoid per expert (GGUF 2)"))
    register(Op("moe", "topk", reference.moe_topk, fast.moe_topk,
                "top-k routing with optional selection bias, group limit, renorm, scale, shared experts"))
    register(Op("softcap", "tanh", reference.softcap_tanh, None, "c * tanh(logits / c)"))
