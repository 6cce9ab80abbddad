"""Registers archrun-mla's vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.hookspecs import hookimpl
from archrun.vocab import Op
from archrun_mla import attention
from archrun_mla.layout import MlaLayout


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "mla", attention.mla_reference, attention.mla_fast,
                "multi-head latent attention (DeepSeek-V2/V3): absorbed scoring over a cached "
                "[k_pe | latent] row per token", layout=MlaLayout()))
