"""Registers archrun-gemma4-ops' vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_blocks import reference
from archrun_gemma4_ops.layout import Gemma4Layout
from archrun_gemma4_ops.residual import ScaledSequential


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "gemma4", reference.CausalAttention, Lazy("archrun_blocks.fast:causal_attention"),
                "Gemma 4: causal attention on its own projections (per-kind head widths, keys reused as "
                "values without attn_v, RMS-normed values, unscaled scores)", layout=Gemma4Layout(),
                # archrun-blocks' causal attention: its kernel members, kv types and sinks binding
                capabilities=OpCapabilities(fused=True, fused_for=True, pool_task=True, slot_arrays=True,
                                            kv_types=True, binds=True)))
    register(Op("residual", "gemma4_scaled", ScaledSequential, None,
                "sequential block whose output is multiplied by the layer's layer_output_scale",
                capabilities=OpCapabilities(binds=True)))
