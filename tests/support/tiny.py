"""The families' tiny HF fixtures (float32 GGUFs with HF transformers logits) by name: `TINY`,
`fixtures(arch...)`, `golden(name)`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FAMILIES = Path(__file__).resolve().parents[2] / "families"
TINY = {p.stem: p for p in sorted(FAMILIES.glob("*/tests/goldens/*.gguf"))}
LEVEL0 = ("qwen3", "qwen3moe", "llama", "qwen2")
GEMMA = ("gemma3",)
GLM = ("glm4moe",)


def fixtures(*archs: str) -> list[str]:
    """Names of the fixtures of the given architectures (the name's prefix before '_')."""
    return sorted(name for name in TINY if name.split("_")[0] in archs)


def golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(TINY[name].with_suffix(".npz"))
    return z["ids"].astype(np.int64), z["logits"]
