"""Registers archrun-llama4's vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_llama4_ops import ops


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "llama4", ops.llama4_reference, Lazy("archrun_llama4_ops.fast:llama4_attention"),
                "Llama 4: chunked attention (chunk = the layer's window) on L2-normalised q/k; "
                "global layers scale q by the temperature tuning",
                capabilities=OpCapabilities(fused=True, fused_for=True, pool_task=True, slot_arrays=True, kv_types=True,
                                            binds=True)))
    register(Op("moe", "topk_input_weighted", ops.topk_input_weighted,
                Lazy("archrun_llama4_ops.fast:topk_input_weighted"),
                "top-k routing whose weights scale each selected expert's input (llama.cpp weight_before_ffn)",
                capabilities=OpCapabilities(act_part=True, fused_layer=True)))
