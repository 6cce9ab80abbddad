"""Tiny random HF transformers models (float32), converted to GGUF, against HF's own logits.

Goldens: tests/goldens/tiny/<fixture>.{gguf,npz}, recorded by tests/goldens/record_tiny.py
with HF transformers (the npz holds HF's logits for every position).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import GOLDENS

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.errors import ArchrunWarning

TINY = GOLDENS / "tiny"
LEVEL0 = ("qwen3", "qwen3moe", "llama", "qwen2")
GEMMA = ("gemma3",)
GLM = ("glm4moe",)


def fixtures(*archs: str) -> list[str]:
    return sorted(p.stem for p in TINY.glob("*.gguf") if p.stem.split("_")[0] in archs)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to max |ref|."""
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(TINY / f"{name}.npz")
    return z["ids"].astype(np.int64), z["logits"]


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("name", fixtures(*LEVEL0, *GEMMA, *GLM))
def test_matches_hf(name, backend):
    ids, ref = golden(name)
    assert len(ids) >= 24
    model = archrun.load(TINY / f"{name}.gguf", backend=backend)
    assert rel_err(model.logits(ids), ref) <= 1e-4
    cache = model.init_cache(len(ids))
    steps = np.stack([model.forward_step([t], cache) for t in ids])
    assert rel_err(steps, ref) <= 1e-4


def test_fixture_set_covers_level0():
    names = fixtures(*LEVEL0)
    for arch in LEVEL0:
        assert any(n.split("_")[0] == arch for n in names), arch
    assert len([n for n in names if n.startswith("qwen3_")]) >= 3
    assert any("tied" in n for n in names) and any("untied" in n for n in names)


@pytest.mark.parametrize("name", fixtures("qwen3")[:1])
def test_unknown_architecture_with_qwen3_layout_loads_generically(name, tmp_path):
    ids, ref = golden(name)
    path = rewrite_gguf(TINY / f"{name}.gguf", tmp_path / "renamed.gguf", architecture="qwen3-mystery")
    with pytest.warns(ArchrunWarning, match="qwen3-mystery.*assuming") as record:
        model = archrun.load(path)
    assumptions = " ".join(str(w.message) for w in record)
    assert "NEOX" in assumptions and "SwiGLU" in assumptions
    assert model.descriptor.architecture == "qwen3-mystery"
    assert rel_err(model.logits(ids), ref) <= 1e-4


@pytest.mark.parametrize("name", fixtures("qwen3")[:1])
def test_block_styles_give_the_same_logits_on_qwen3(name):
    ids, ref = golden(name)
    fused = archrun.load(TINY / f"{name}.gguf")
    host = archrun.load(TINY / f"{name}.gguf", block_style="host_reference")
    a = fused.logits(ids)
    b = host.host_step(ids, host.init_cache(len(ids))).logits
    assert rel_err(a, b) <= 1e-5 and rel_err(b, ref) <= 1e-4
