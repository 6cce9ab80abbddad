"""The real test models (from PyPI packages, fetched by `make models`) and the recorded goldens' folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MODEL_DIR = Path(os.environ.get("ARCHRUN_MODEL_DIR", Path.home() / ".cache" / "archrun" / "models"))
REAL_MODELS = {
    "smollm2": MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen25": MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": MODEL_DIR / "gemma-3-270m-q4_k_m.gguf",
}
GOLDENS = Path(__file__).resolve().parents[2] / "goldens"


def real_model(name: str) -> Path:
    """Path of a real model; skips the test when `make models` has not fetched it."""
    path = REAL_MODELS[name]
    if not path.exists():
        pytest.skip(f"{path} not present (run `make models`)")
    return path
