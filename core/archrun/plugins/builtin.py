"""archrun's built-in plugin: the two block styles, registered through the same hook as any plugin."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.run.decoders import fused_style, host_reference_style
from archrun.vocab import Op


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("block_style", "fused", fused_style, None, "fast decoder shape with batched decode entries"))
    register(Op("block_style", "host_reference", host_reference_style, None,
                "auditable host-side float32 shape with host_step (small ops in their float32 reference form; "
                "heavy linears and MoE stay fast)", capabilities=OpCapabilities(op_backend="reference")))
