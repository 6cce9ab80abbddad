"""Shared fixtures: real model paths (skipped when absent) and synthetic model factories."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: synth, gguf_fixtures, test_tiny_hf
# the CLI under test loads models directly: no background kernel warm-ups (archrun.tiered) per
# invocation; tests/test_tiered.py turns it back on where it tests it
os.environ["ARCHRUN_TIERED"] = "0"

MODEL_DIR = Path(os.environ.get("ARCHRUN_MODEL_DIR", Path.home() / ".cache" / "archrun" / "models"))
REAL_MODELS = {
    "smollm2": MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen25": MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": MODEL_DIR / "gemma-3-270m-q4_k_m.gguf",
}
GOLDENS = Path(__file__).parent / "goldens"


def real_model(name: str) -> Path:
    """Path of a real model; skips the test when `make models` has not fetched it."""
    path = REAL_MODELS[name]
    if not path.exists():
        pytest.skip(f"{path} not present (run `make models`)")
    return path


@pytest.fixture
def synth_model(tmp_path):
    """Factory: write a synthetic model with tests/synth.py and return its path."""
    from synth import write_model

    counter = iter(range(10**6))

    def make(**kw):
        return write_model(tmp_path / f"m{next(counter)}.gguf", **kw)

    return make

