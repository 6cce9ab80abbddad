"""forward_step_batch / forward_step_batch_spans: several sequences, each at its own position in its
own cache, in one pass, agreeing with per-sequence forward_step."""

from __future__ import annotations

import numpy as np
import pytest
from support.models import real_model
from support.tiny import TINY, fixtures, golden

import archrun
from archrun.conformance.hf import rel_err
from archrun.errors import InvalidRequest, WrongBlockStyle

MARGIN = 1.0  # as tests/run/test_real_models.py: argmax must agree where the top-2 margin is clear


@pytest.fixture(scope="module", params=fixtures("gemma3")[:1])
def gemma(request):  # sliding-window layers (ring slots) and global ones
    return request.param, archrun.load(TINY[request.param])


def test_spans_of_several_sequences_match_one_at_a_time(gemma):
    name, model = gemma
    ids, _ = golden(name)
    ids = [int(t) for t in ids]
    prefixes, spans = [ids[:3], ids[:17], ids[5:30]], [ids[3:9], ids[17:18], ids[30:34]]
    solo, together = [], []
    for prefix in prefixes:  # windows crossed at different points; rings of 2 spare rows
        for caches in (solo, together):
            caches.append(model.init_cache(64, max_rewind=2))
            model.forward_step(prefix, caches[-1])
    want = [model.forward_step(s, c, all_logits=True) for s, c in zip(spans, solo, strict=True)]
    got = model.forward_step_batch_spans(spans, together, all_logits=True)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape and rel_err(g, w) <= 1e-4
    assert [len(c) for c in together] == [len(c) for c in solo]
    last = model.forward_step_batch([[t] for t in ids[-3:]], together)
    for t, c, g in zip(ids[-3:], solo, last, strict=True):
        assert rel_err(g, model.forward_step([t], c)) <= 1e-4


def test_batch_of_real_decode_steps_within_decode_bounds():
    model = archrun.load(real_model("smollm2"))
    tok = model.tokenizer
    prompts = [tok.encode(p) for p in ("The cat sat on", "In 1492, Columbus", "Rivers flow to the", "Hello")]
    solo = [model.init_cache(64) for _ in prompts]
    together = [model.init_cache(64) for _ in prompts]
    for p, a, b in zip(prompts, solo, together, strict=True):
        model.forward_step(p, a)
        model.forward_step(p, b)
    nxt = [[p[-1]] for p in prompts]
    want = np.stack([model.forward_step(t, c) for t, c in zip(nxt, solo, strict=True)])
    got = np.stack(model.forward_step_batch(nxt, together))
    span = want.max(axis=1) - want.min(axis=1)
    assert (np.abs(got - want).max(axis=1) / span).max() <= 0.1
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > MARGIN
    np.testing.assert_array_equal(got.argmax(1)[clear], want.argmax(1)[clear])


def test_batch_entries_refuse_bad_calls(gemma):
    _, model = gemma
    a, b = model.init_cache(8), model.init_cache(8)
    with pytest.raises(InvalidRequest):
        model.forward_step_batch([[1], [2]], [a])
    with pytest.raises(InvalidRequest):
        model.forward_step_batch([[1], [2]], [a, a])
    with pytest.raises(InvalidRequest):
        model.forward_step_batch([], [])
    with pytest.raises(archrun.ContextOverflow):
        model.forward_step_batch([[1] * 9, [2]], [a, b])
    assert len(a) == len(b) == 0  # refused before anything was computed


def test_host_reference_style_refuses_the_batch_entries(gemma):
    name, _ = gemma
    host = archrun.load(TINY[name], block_style="host_reference")
    with pytest.raises(WrongBlockStyle):
        host.forward_step_batch_spans([[1]], [host.init_cache(4)])
