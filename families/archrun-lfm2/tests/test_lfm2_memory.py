"""lfm2 beyond the standard battery: per-layer kinds, the short convolutions' rewindable state
(rewind = recompute, checkpoints for a chat's next turn, speculative decoding's rejected drafts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun import speculative
from archrun.cache import PrefixCache
from archrun.conformance import hf
from archrun.speculative import Draft, Drafter

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("lfm2_ccac", "lfm2_acca_l4", "lfm2_accc_l2")


def _golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    g = hf.load_golden(GOLDENS / f"{name}.npz")
    return g["ids"].astype(np.int64), g["logits"]


@pytest.fixture(scope="module", params=[(n, b) for n in FIXTURES[:2] for b in hf.BACKENDS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def loaded(request):
    name, backend = request.param
    return name, archrun.load(GOLDENS / f"{name}.gguf", backend=backend)


def test_layers_choose_their_kind_from_head_count_kv(loaded):
    name, model = loaded
    kinds = [layer.attention.kind for layer in model.descriptor.layers]
    pattern = name.split("_")[1]
    assert kinds == ["shortconv" if k == "c" else "causal" for k in pattern]


def test_prefill_equals_steps_equals_chunks(loaded):
    name, model = loaded
    ids, ref = _golden(name)
    cache = model.init_cache(len(ids))
    chunks = [model.forward_step(ids[i:i + 7], cache, all_logits=True) for i in range(0, len(ids), 7)]
    assert hf.rel_err(np.concatenate(chunks), ref) <= hf.TOLERANCE


@pytest.mark.parametrize("k", [1, 3, 5])
def test_decode_rewind_three_decode_again_equals_fresh(loaded, k):
    """Prefill, decode k tokens, rewind 3, decode other tokens: the logits of a fresh run."""
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


def test_rewind_reach_is_what_the_ring_keeps(loaded):
    name, model = loaded
    ids, _ = _golden(name)
    cache = model.init_cache(len(ids), max_rewind=4)
    model.forward_step(ids[:20], cache)
    assert cache.max_rewind == 4 and cache.restore_point(16) == 16
    assert cache.restore_point(15) == 0           # no checkpoint: only a start over
    with pytest.raises(archrun.InvalidRequest, match="recurrent"):
        cache.rewind(5)


def test_checkpoint_is_a_restore_point(loaded):
    name, model = loaded
    ids, ref = _golden(name)
    cache = model.init_cache(len(ids), max_rewind=2)
    model.forward_step(ids[:12], cache)
    cache.checkpoint()
    model.forward_step(ids[12:30], cache)
    assert cache.restore_point(20) == 12
    cache.rewind(len(cache) - 12)
    again = model.forward_step(ids[12:], cache, all_logits=True)
    assert hf.rel_err(again, ref[12:]) <= hf.TOLERANCE


def test_chat_prefix_reuse_recomputes_only_from_the_checkpoint():
    """Turn 2's prompt shares turn 1's prompt but not its reply (a template that re-renders the
    reply): the cache returns to the checkpoint kept where turn 1's prompt ended and recomputes
    only from there; the logits are those of a fresh run."""
    ids, ref = _golden("lfm2_ccac")
    model = archrun.load(GOLDENS / "lfm2_ccac.gguf", backend="reference")
    cache = PrefixCache(model.init_cache(len(ids), max_rewind=2))
    prompt1 = [int(t) for t in ids[:15]]
    model.forward_step(cache.prepare(prompt1), cache.cache)
    cache.fed(prompt1)                                   # the prompt is complete: a checkpoint at 15
    reply = [(t + 1) % model.descriptor.n_vocab for t in ids[15:25]]
    for t in reply:
        model.forward_step([t], cache.cache)
        cache.fed([t])
    prompt2 = [int(t) for t in ids]                      # diverges from the cached ids at 15
    feed = cache.prepare(prompt2)
    assert cache.recomputed == len(feed) == len(ids) - 15
    logits = model.forward_step(feed, cache.cache, all_logits=True)
    assert hf.rel_err(logits, ref[15:]) <= hf.TOLERANCE


class _Guess(Drafter):
    """Drafts k copies of the last token: mostly rejected, so most rounds rewind."""

    def propose(self, history, k, sampler):
        return Draft(tuple([int(history[-1])] * k))


def test_speculative_rejection_rewinds_through_the_ring():
    """Speculative decoding on a hybrid model (rejected drafts rewound every round): greedy output
    equals plain greedy decoding."""
    model = archrun.load(GOLDENS / "lfm2_acca_l4.gguf", backend="reference")
    ids, _ = _golden("lfm2_acca_l4")
    prompt = [int(t) for t in ids[:12]]
    plain = archrun.generate(model, prompt, max_tokens=16, temperature=0.0)
    want = "".join(plain)
    gen = speculative.generate(model, prompt, _Guess(), draft_max=4, max_tokens=16, temperature=0.0)
    assert "".join(gen) == want
    t = gen.result.timings
    assert t["spec_drafted"] > 0 and t["spec_acceptance"] < 1.0   # drafts were rejected and rewound


def test_state_bytes_do_not_grow_with_the_context():
    model = archrun.load(GOLDENS / "lfm2_ccac.gguf", backend="reference")
    small, big = model.init_cache(20, max_rewind=2), model.init_cache(40, max_rewind=2)
    conv = [i for i, layer in enumerate(model.descriptor.layers) if layer.attention.kind == "shortconv"]
    assert all(small.slots[i].nbytes == big.slots[i].nbytes for i in conv)


def test_inspect_shows_each_layers_kind_and_its_state_bytes():
    from archrun.inspect import inspect_model, render_text

    info = inspect_model(GOLDENS / "lfm2_ccac.gguf")
    d, kv = 64, 2 * 16  # width; kv heads x head_dim
    assert info["memory"] == [
        {"kind": "shortconv", "bytes_per_token": 0, "state_bytes": 2 * d * 4},   # (l_cache - 1) rows of d
        {"kind": "shortconv", "bytes_per_token": 0, "state_bytes": 2 * d * 4},
        {"kind": "causal", "bytes_per_token": 2 * kv * 4, "state_bytes": 0},      # a K and a V row per token
        {"kind": "shortconv", "bytes_per_token": 0, "state_bytes": 2 * d * 4},
    ]
    text = render_text(info)
    assert "memory 0-1     shortconv: 0 B/token, state 512 B" in text
    assert "per sequence  256 B/token + 1536 B of state" in text


def test_a_batch_of_sequences_keeps_each_its_own_state():
    """forward_step_batch_spans runs each span's mixer in its own slot: equal to separate runs."""
    model = archrun.load(GOLDENS / "lfm2_ccac.gguf", backend="fast")
    ids, ref = _golden("lfm2_ccac")
    a, b = model.init_cache(len(ids)), model.init_cache(len(ids))
    model.forward_step(ids[:10], a)
    got = model.forward_step_batch_spans([ids[10:14], ids[:5]], [a, b], all_logits=True)
    assert hf.rel_err(got[0], ref[10:14]) <= hf.TOLERANCE and hf.rel_err(got[1], ref[:5]) <= hf.TOLERANCE
