"""Registers archrun-gemma4-ops' vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_gemma4_ops import attention, moe, ple_stream
from archrun_gemma4_ops.layout import Gemma4Layout
from archrun_gemma4_ops.residual import ScaledSequential


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "gemma4", attention.gemma4_reference, attention.gemma4_fast,
                "Gemma 4: causal attention on its own projections (per-kind head widths, q/k norms, keys "
                "reused as values without attn_v, RMS-normed values, unscaled scores); the last "
                "shared_kv_layers layers reuse an earlier layer's keys and values",
                layout=Gemma4Layout(),  # the fast op's layer decodes fused: its own layer kernel
                capabilities=OpCapabilities(kv_types=True, binds=True, fused=True, fused_layer=True,
                                            slot_arrays=True)))
    register(Op("residual", "gemma4_scaled", ScaledSequential, Lazy("archrun_gemma4_ops.residual:scaled_fast"),
                "sequential block whose output is multiplied by the layer's layer_output_scale",
                capabilities=OpCapabilities(binds=True, fused=True, fused_input=True)))
    register(Op("stream", "gemma4_ple", ple_stream.Gemma4Ple, None,
                "Gemma 4's per-layer inputs (E2B/E4B): a token table and a projection of the embeddings give each "
                "layer an input that gates a projection added after the block, before the layer scalar; files "
                "without them run one stream",
                layout=ple_stream.PleLayout(), capabilities=OpCapabilities(branches=True)))
    register(Op("moe", "gemma4_moe", moe.Gemma4Moe, None,
                "Gemma 4's mixture block: a normed dense MLP beside softmax top-k experts routed on the unnormed "
                "stream (per-expert scales), each half with its own norms",
                capabilities=OpCapabilities(binds=True, own_ffn_norm=True)))
