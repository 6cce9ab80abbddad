"""Registers archrun-recurrent's vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

import pluggy

from archrun.vocab import Lazy, Op
from archrun_recurrent import shortconv

hookimpl = pluggy.HookimplMarker("archrun")


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "shortconv", shortconv.shortconv_reference,
                Lazy("archrun_recurrent.shortconv:shortconv_fast"),
                "gated short convolution (LFM2): out_proj(C * conv(B * x)) over the last l_cache gated inputs",
                layout=shortconv.ShortConvLayout()))
