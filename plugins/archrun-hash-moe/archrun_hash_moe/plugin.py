"""Registers archrun-hash-moe's MoE op through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_hash_moe import HashLayout, hash_topk


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("moe", "hash_topk", hash_topk, Lazy("archrun_hash_moe:hash_topk_fast"),
                "top-k routing, except in hash layers (a token -> experts table, ffn_gate_tid2eid): the row's token "
                "id picks the experts, the router's scores weight them (DeepSeek-V4)",
                layout=HashLayout(), capabilities=OpCapabilities(token_ids=True, binds=True)))
