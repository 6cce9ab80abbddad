"""Registers archrun-deepseek4-ops' vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_deepseek4_ops import attention, gating, hash_moe, mhc_stream, swiglu


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("gating", "sqrtsoftplus", gating.sqrtsoftplus, Lazy("archrun_deepseek4_ops.gating:sqrtsoftplus_fast"),
                "sqrt(softplus(logits)) per expert (GGUF 4, DeepSeek-V4)", capabilities=OpCapabilities(fused=True)))
    register(Op("activation", "swiglu_clamp", swiglu.swiglu_clamp,
                Lazy("archrun_deepseek4_ops.swiglu:swiglu_clamp_fast"),
                "SwiGLU on min(gate, L) and clip(up, -L, L), L the file's per-layer swiglu_clamp_exp (DeepSeek-V4)",
                layout=swiglu.ClampLayout()))
    register(Op("attention", "deepseek4", attention.v4_reference, Lazy("archrun_deepseek4_ops.attention:v4_fast"),
                "DeepSeek-V4 attention: q LoRA with per-head norm, one shared K=V head roped on its trailing dims "
                "(undone on the output), sinks, sliding window, grouped low-rank output; CSA/HCA layers add "
                "compressed entries of closed windows (CSA: overlapping, lightning-indexer top-k)",
                layout=attention.V4Layout(), capabilities=OpCapabilities(binds=True)))
    register(Op("stream", "mhc", mhc_stream.MhcStream, Lazy("archrun_deepseek4_ops.mhc_stream:mhc_stream_fast"),
                "DeepSeek-V4's manifold-constrained hyper-connections: hyper_connection.count residual streams, "
                "Sinkhorn-projected mixing around each attention and FFN branch, the head's collapse",
                layout=mhc_stream.MhcLayout(), capabilities=OpCapabilities(branches=True)))
    register(Op("moe", "hash_topk", hash_moe.hash_topk, Lazy("archrun_deepseek4_ops.hash_moe:hash_topk_fast"),
                "top-k routing, except in hash layers (a token -> experts table, ffn_gate_tid2eid): the row's token "
                "id picks the experts, the router's scores weight them (DeepSeek-V4)",
                layout=hash_moe.HashLayout(), capabilities=OpCapabilities(token_ids=True, binds=True)))
