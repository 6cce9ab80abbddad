"""Registers archrun-recurrent's vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

import pluggy

from archrun.vocab import Lazy, Op
from archrun_recurrent import mamba2, shortconv

hookimpl = pluggy.HookimplMarker("archrun")


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "shortconv", shortconv.shortconv_reference,
                Lazy("archrun_recurrent.shortconv:shortconv_fast"),
                "gated short convolution (LFM2): out_proj(C * conv(B * x)) over the last l_cache gated inputs",
                layout=shortconv.ShortConvLayout()))
    register(Op("attention", "mamba2", mamba2.mamba2_reference, Lazy("archrun_recurrent.mamba2:mamba2_fast"),
                "Mamba2 selective state-space mixer (SSD): conv1d, dt/A/D, gated grouped RMSNorm, a state per head",
                layout=mamba2.Mamba2Layout()))
