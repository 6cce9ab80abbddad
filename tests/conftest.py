"""Shared fixtures: synthetic model factories (the real models' paths: support.models)."""

from __future__ import annotations

import os

import pytest

# the CLI under test loads models directly: no background kernel warm-ups (archrun.run.tiered) per
# invocation; tests/run/test_tiered.py turns it back on where it tests it
os.environ["ARCHRUN_TIERED"] = "0"

@pytest.fixture
def synth_model(tmp_path):
    """Factory: write a synthetic model with tests/support/synth.py and return its path."""
    from support.synth import write_model

    counter = iter(range(10**6))

    def make(**kw):
        return write_model(tmp_path / f"m{next(counter)}.gguf", **kw)

    return make

