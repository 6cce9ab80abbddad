"""Clamped SwiGLU (DeepSeek-V4's routed and shared experts): silu(min(g, L)) * clip(u, -L, L).

HF DeepseekV4Experts / DeepseekV4MLP clamp the gate from above and the up projection both ways by
`swiglu_limit`; llama.cpp's build_moe_ffn does the same with the file's per-layer
`{arch}.swiglu_clamp_exp` (`swiglu_clamp_shexp` for the shared expert; a limit <= 1e-6 is no clamp).
`ClampLayout` reads the layer's limit at compile time; the op's one mixture activation serves both
the routed and the shared experts, so a file whose two limits differ in a layer is refused.
Ungated (no up projection): silu(min(x, L)).
"""

from __future__ import annotations

import numpy as np

from archrun.errors import MetadataError

F32 = np.float32
KEY, SHARED_KEY = "{arch}.swiglu_clamp_exp", "{arch}.swiglu_clamp_shexp"
NO_CLAMP = 1e-6  # llama.cpp: a limit at or below this is none


class ClampLayout:
    """The layer's limit from the file: {"params": {"limit": L}} (an ActivationLayout)."""

    def describe(self, ctx) -> dict:
        n = ctx.meta.get("block_count", int)
        limit = ctx.meta.per_layer_floats(KEY, n)[ctx.layer]
        if ctx.meta.has(SHARED_KEY.removeprefix("{arch}.")):
            shared = ctx.meta.per_layer_floats(SHARED_KEY, n)[ctx.layer]
            if shared != limit:
                raise MetadataError(f"layer {ctx.layer}: swiglu_clamp_shexp {shared} differs from "
                                    f"swiglu_clamp_exp {limit}; one clamped SwiGLU serves both")
        return {"params": {"limit": limit}}


def _clamped(silu, limit: float):
    lim = F32(limit)
    clamp = limit > NO_CLAMP

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x, F32)
        g = np.minimum(x, lim) if clamp else x
        if up is None:
            return silu(g)
        up = np.asarray(up, F32)
        return silu(g, np.clip(up, -lim, lim) if clamp else up)

    return act


def swiglu_clamp(limit: float = 10.0):
    """The reference op: act(x, up) = silu(min(x, limit)) * clip(up, -limit, limit), float32."""
    from archrun_blocks import reference

    return _clamped(reference.silu(), limit)


def swiglu_clamp_fast(limit: float = 10.0):
    """The fast op: the clamps in numpy, then archrun-blocks' SiLU kernel part over the rows. It carries no
    part of its own (a part sees the gate only, and the clamp reaches the up projection too), so a
    mixture with it runs its experts op by op on the fast products."""
    from archrun_blocks import fast

    return _clamped(fast.silu(), limit)
