"""The Decoder Protocol states the entries the block styles carry, with the same parameters."""

from __future__ import annotations

import inspect

import pytest

from archrun.decoder import Decoder
from archrun.run.decoders import fused_style, host_reference_style

ENTRIES = [n for n, f in vars(Decoder).items() if inspect.isfunction(f) and not n.startswith("_")]


@pytest.mark.parametrize("style", [fused_style, host_reference_style], ids=["fused", "host_reference"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_protocol_entry_matches_the_block_style(style, entry):
    declared = inspect.signature(getattr(Decoder, entry))
    actual = inspect.signature(getattr(style(), entry))
    assert [(p.name, p.default) for p in declared.parameters.values()] == \
           [(p.name, p.default) for p in actual.parameters.values()]


def test_init_cache_takes_a_kv_type():
    assert inspect.signature(Decoder.init_cache).parameters["kv_type"].default == "f32"
