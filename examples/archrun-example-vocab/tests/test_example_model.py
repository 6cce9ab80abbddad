"""A synthetic quickgelu-llama file loads through this package's family and op, and decodes fused.

Checked against an independent float64 numpy forward pass of the file (quickgelu_model.forward),
against archrun's reference backend, and token by token (the fused one-call-per-layer decode
path, which runs gelu_quick's kernel part) against a whole-sequence prefill (the op-by-op
path, which runs the fast op).
"""

from __future__ import annotations

import numpy as np
import pytest
from quickgelu_model import ARCH, DIMS, forward, write_model

import archrun

IDS = [0, 17, 5, 93, 42, 8, 60, 11, 2, 29, 77, 3]


def rel(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to the range of ref."""
    return float(np.abs(got - ref).max() / (ref.max() - ref.min()))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("quickgelu") / "quickgelu-llama.gguf")


@pytest.fixture(scope="module")
def model(path):
    return archrun.load(path, backend="fast")


@pytest.fixture(scope="module")
def numpy_logits(path):
    logits, probs = forward(path, IDS)
    # the file is a meaningful test: attention is far from uniform, the FFN gate spans both signs
    assert max(float(p[:, -1, :].max()) for p in probs) > 0.5
    return logits


def test_the_family_and_op_are_used(model):
    d = model.descriptor
    assert d.architecture == ARCH and d.n_layer == DIMS["n_layer"]
    assert all(layer.ffn.activation == "gelu_quick" for layer in d.layers)


def test_decodes_fused(model):
    assert model.fused_blocks is not None and len(model.fused_blocks) == DIMS["n_layer"]


def test_prefill_equals_numpy_float64_forward(model, numpy_logits):
    got = model.forward_step(IDS, model.init_cache(32), all_logits=True)
    assert got.shape == numpy_logits.shape
    assert rel(got, numpy_logits) <= 1e-4


def test_token_by_token_decode_equals_prefill(model, numpy_logits):
    cache = model.init_cache(32)
    prefill = model.forward_step(IDS, cache, all_logits=True)
    cache = model.init_cache(32)
    steps = np.stack([model.forward_step([t], cache) for t in IDS])  # one fused call per layer per token
    assert rel(steps, prefill) <= 1e-4
    assert rel(steps, numpy_logits) <= 1e-4


def test_reference_backend_agrees(path, model, numpy_logits):
    ref = archrun.load(path, backend="reference")
    want = ref.forward_step(IDS, ref.init_cache(32), all_logits=True)
    assert rel(want, numpy_logits) <= 1e-4
    assert rel(model.forward_step(IDS, model.init_cache(32), all_logits=True), want) <= 1e-4


def test_the_activation_matters(path, numpy_logits):
    # the same file with SiLU (a caller's hint over the family's) gives other logits: gelu_quick is really run
    silu = archrun.load(path, backend="reference", hints={"activation": "silu"})
    other = silu.forward_step(IDS, silu.init_cache(32), all_logits=True)
    assert rel(other, numpy_logits) > 1e-2
