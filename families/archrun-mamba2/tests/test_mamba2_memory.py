"""mamba2 beyond the standard battery: the state-space mixer's rewindable state (decode, rewind 3,
decode = a fresh run; checkpoints), chunked prefill, and the state's size in `archrun inspect`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import hf

GOLDENS = Path(__file__).parent / "goldens"


def _golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    g = hf.load_golden(GOLDENS / f"{name}.npz")
    return g["ids"].astype(np.int64), g["logits"]


@pytest.fixture(scope="module", params=[(n, b) for n in ("mamba2_g1_k4", "mamba2_g2_k3_tied") for b in hf.BACKENDS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def loaded(request):
    name, backend = request.param
    return name, archrun.load(GOLDENS / f"{name}.gguf", backend=backend)


def test_every_layer_is_a_mamba2_block_without_ffn(loaded):
    _, model = loaded
    assert all(ly.attention.kind == "mamba2" and ly.ffn is None for ly in model.descriptor.layers)


def test_chunked_prefill_equals_hf(loaded):
    name, model = loaded
    ids, ref = _golden(name)
    cache = model.init_cache(len(ids))
    chunks = [model.forward_step(ids[i:i + 9], cache, all_logits=True) for i in range(0, len(ids), 9)]
    assert hf.rel_err(np.concatenate(chunks), ref) <= hf.TOLERANCE


@pytest.mark.parametrize("k", [1, 3, 6])
def test_decode_rewind_three_decode_again_equals_fresh(loaded, k):
    name, model = loaded
    ids, ref = _golden(name)
    cache = model.init_cache(len(ids), max_rewind=4)
    model.forward_step(ids[:20], cache)
    for t in ids[20:20 + k]:
        model.forward_step([t], cache)
    cache.rewind(3)
    keep = 20 + k - 3
    again = np.stack([model.forward_step([t], cache) for t in ids[keep:keep + 6]])
    assert hf.rel_err(again, ref[keep:keep + 6]) <= hf.TOLERANCE


def test_a_checkpoint_is_returned_to_and_recomputed_from(loaded):
    name, model = loaded
    ids, ref = _golden(name)
    cache = model.init_cache(len(ids), max_rewind=2)
    model.forward_step(ids[:10], cache)
    cache.checkpoint()
    model.forward_step(ids[10:30], cache)
    assert cache.restore_point(25) == 10
    cache.rewind(20)
    assert hf.rel_err(model.forward_step(ids[10:], cache, all_logits=True), ref[10:]) <= hf.TOLERANCE


def test_inspect_shows_a_fixed_state_and_no_per_token_bytes():
    from archrun.inspect import inspect_model

    memory = inspect_model(GOLDENS / "mamba2_g1_k4.gguf")["memory"]
    conv, ssm = 3 * (128 + 2 * 16), 8 * 16 * 16   # (K-1) x conv_dim; heads x head_dim x state
    assert memory == [{"kind": "mamba2", "bytes_per_token": 0, "state_bytes": 4 * (conv + ssm)}] * 3
