"""Several sequences in one batched step carry their own AltUp streams and per-layer inputs: each row's
logits are its own sequence's, whichever rows share the step (the stream op runs on the rows of all)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import hf

GOLDENS = Path(__file__).resolve().parent / "goldens"


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_batched_sequences_match_one_by_one(backend):
    name = "gemma3n_active1_untied"
    ids = hf.load_golden(GOLDENS / f"{name}.npz")["ids"].astype(np.int64)
    model = archrun.load(GOLDENS / f"{name}.gguf", backend=backend)
    if not model.caps.batch:
        pytest.skip(f"{backend}: no batched entries")
    a, b = ids[:9], ids[9:20]
    caches = [model.init_cache(32), model.init_cache(32)]
    spans = model.forward_step_batch_spans([a, b], caches, all_logits=True)
    scale = float(np.abs(spans[0]).max())
    for got, seq in zip(spans, (a, b), strict=True):
        assert np.abs(got - model.logits(seq)).max() <= 1e-5 * scale
    steps = model.forward_step_batch([[ids[30]], [ids[31]]], caches)
    for got, seq in zip(steps, (np.append(a, ids[30]), np.append(b, ids[31])), strict=True):
        assert np.abs(got - model.logits(seq)[-1]).max() <= 1e-5 * scale
