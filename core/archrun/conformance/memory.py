"""The memory battery: rewinds, checkpoints and prefix reuse of models whose layers keep state.

A layer's cache slot that cannot be truncated (a recurrent state, a convolution window; alone or
beside attention rows in a ``PairSlot``) states ``can_restore(length)`` and keeps copies of its
state (``archrun.run.cache``). The kit generates these checks for every tiny HF fixture whose model
has such a slot (``is_stateful``), each against the fixture's HF float32 logits (an independent
reference), on the backend given:

- ``check_chunked_prefill``: the prompt fed in chunks of 7 through the cache = HF;
- ``check_decode_rewind``: prefill 20, decode k tokens, rewind 3, decode 6 more = HF (the states
  after each of the last tokens are what a rewind returns to);
- ``check_rewind_reach``: with ``max_rewind=4`` the cache returns to any of the last 4 lengths,
  to nothing earlier (no checkpoint: only a start over), and refuses a rewind of 5 with a typed error;
- ``check_checkpoint``: a checkpoint is a restore point; recomputing from it = HF;
- ``check_chat_reuse``: a chat's next turn that re-renders the previous reply returns to the
  checkpoint ``PrefixCache`` kept where the previous prompt ended and recomputes only from there
  (``PrefixCache.recomputed``); the logits = HF;
- ``check_speculative``: speculative decoding with a drafter whose drafts are mostly rejected
  (every rejection rewinds the states) = plain greedy decoding;
- ``check_batch_spans``: a batch of two sequences keeps each its own state (= HF per sequence);
- ``check_state_is_fixed``: the stateful slots' state does not grow with the context.

What stays with the family: which layers are stateful (layer kinds) and the state's size in
``archrun inspect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from archrun.conformance import hf

#: prompt tokens fed before the rewinds (the fixtures hold ``hf.N_TOKENS`` = 40)
PREFIX = 20
#: tokens decoded before rewinding 3, per ``check_decode_rewind`` case
DECODED = (1, 4)

_STATEFUL: dict[str, bool] = {}


def _stateful_slots(cache: Any) -> list[Any]:
    return [s for s in cache.slots if callable(getattr(s, "can_restore", None))]


def is_stateful(gguf_path: Path) -> bool:
    """Whether any layer of the model keeps a slot that restores instead of truncating (cached per file)."""
    import archrun

    key = str(gguf_path)
    if key not in _STATEFUL:
        model = archrun.load(gguf_path, backend="reference")
        _STATEFUL[key] = bool(_stateful_slots(model.init_cache(4)))
    return _STATEFUL[key]


def golden(gguf_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [n], HF logits [n, vocab]) of a fixture."""
    g = hf.load_golden(Path(gguf_path).with_suffix(".npz"))
    return g["ids"].astype(np.int64), g["logits"]


def _assert_close(what: str, got: np.ndarray, want: np.ndarray, first: int) -> None:
    """archrun vs HF within ``hf.TOLERANCE``; the message names the first diverging position (counted
    in the fixture's ids) and element."""
    from archrun.conformance.trace import first_diff

    err = hf.rel_err(got, want)
    if err <= hf.TOLERANCE:
        return
    found = first_diff(np.asarray(got), np.asarray(want), hf.TOLERANCE)
    where = ""
    if found is not None:
        p, element = found
        where = (f"first diverging position {first + p} (element {list(element)[1:]}: {got[element]:.6g} vs HF "
                 f"{want[element]:.6g}); ")
    raise AssertionError(f"{what}: {where}max |Δ| {err:.2e} of max |logit| > {hf.TOLERANCE:g}")


def check_chunked_prefill(model: Any, ids: np.ndarray, ref: np.ndarray, name: str, chunk: int = 7) -> None:
    cache = model.init_cache(len(ids))
    chunks = [model.forward_step(ids[i:i + chunk], cache, all_logits=True) for i in range(0, len(ids), chunk)]
    _assert_close(f"{name}: the prompt in chunks of {chunk} vs HF", np.concatenate(chunks), ref, 0)


def check_decode_rewind(model: Any, ids: np.ndarray, ref: np.ndarray, name: str, k: int) -> None:
    """Prefill PREFIX, decode k, rewind 3, decode 6: the logits of a fresh run."""
    cache = model.init_cache(len(ids), max_rewind=4)
    model.forward_step(ids[:PREFIX], cache)
    for t in ids[PREFIX:PREFIX + k]:
        model.forward_step([t], cache)
    cache.rewind(3)
    keep = PREFIX + k - 3
    again = np.stack([model.forward_step([t], cache) for t in ids[keep:keep + 6]])
    _assert_close(f"{name}: prefill {PREFIX}, decode {k}, rewind 3, decode 6 vs HF", again, ref[keep:keep + 6], keep)


def check_rewind_reach(model: Any, ids: np.ndarray, name: str) -> None:
    """``max_rewind=4``: the last 4 lengths restore, the one before does not (only a start over)."""
    import pytest

    from archrun.errors import InvalidRequest

    cache = model.init_cache(len(ids), max_rewind=4)
    model.forward_step(ids[:PREFIX], cache)
    assert cache.max_rewind == 4, f"{name}: a cache made with max_rewind=4 states a reach of {cache.max_rewind}"
    assert cache.restore_point(PREFIX - 4) == PREFIX - 4, f"{name}: cannot return 4 tokens back"
    assert cache.restore_point(PREFIX - 5) == 0, (
        f"{name}: claims to return 5 tokens back ({cache.restore_point(PREFIX - 5)}) without a checkpoint")
    with pytest.raises(InvalidRequest):
        cache.rewind(5)


def check_checkpoint(model: Any, ids: np.ndarray, ref: np.ndarray, name: str, at: int = 12) -> None:
    """A checkpoint at ``at`` is where a later rewind beyond the reach returns; recomputing = HF."""
    cache = model.init_cache(len(ids), max_rewind=2)
    model.forward_step(ids[:at], cache)
    cache.checkpoint()
    model.forward_step(ids[at:30], cache)
    point = cache.restore_point(PREFIX)
    assert point == at, f"{name}: restore point of {PREFIX} is {point}, not the checkpoint at {at}"
    cache.rewind(len(cache) - at)
    _assert_close(f"{name}: recomputed from the checkpoint at {at} vs HF",
                  model.forward_step(ids[at:], cache, all_logits=True), ref[at:], at)


def check_chat_reuse(model: Any, ids: np.ndarray, ref: np.ndarray, name: str, turn: int = 18) -> None:
    """Turn 1: prompt ids[:turn] and a reply; turn 2's prompt (all ids) differs from the reply. The
    cache returns to the checkpoint kept at ``turn`` and recomputes only the rest."""
    from archrun.run.cache import PrefixCache

    cache = PrefixCache(model.init_cache(len(ids), max_rewind=2))
    prompt1 = [int(t) for t in ids[:turn]]
    model.forward_step(cache.prepare(prompt1), cache.cache)
    cache.fed(prompt1)  # the prompt is complete: a checkpoint at `turn`
    for t in [(int(t) + 7) % model.descriptor.n_vocab for t in ids[turn:turn + 8]]:  # a reply turn 2 re-renders
        model.forward_step([t], cache.cache)
        cache.fed([t])
    feed = cache.prepare([int(t) for t in ids])
    assert cache.recomputed == len(feed) == len(ids) - turn, (
        f"{name}: turn 2 recomputes {cache.recomputed} tokens (feeds {len(feed)}), not the {len(ids) - turn} "
        f"after the checkpoint where turn 1's prompt ended")
    _assert_close(f"{name}: turn 2 from the checkpoint at {turn} vs HF",
                  model.forward_step(feed, cache.cache, all_logits=True), ref[turn:], turn)


def _rejected_drafter():
    from archrun.generation.speculative import Draft, Drafter

    class Rejected(Drafter):
        """Drafts k copies of the last token plus one: mostly rejected, so most rounds rewind."""

        def propose(self, history, k, sampler):
            return Draft(tuple([int(history[-1]) + 1] * k))

    return Rejected()


def check_speculative(model: Any, ids: np.ndarray, name: str, n: int = 14) -> None:
    """Speculative decoding whose drafts are rejected (each rejection rewinds the states) = plain greedy."""
    import archrun
    from archrun.generation import speculative

    prompt = [int(t) for t in ids[:10]]
    no_end = {t: -100.0 for t in model.tokenizer.eog_ids}
    want = archrun.generate(model, prompt, max_tokens=n, temperature=0.0, logit_bias=no_end).complete().token_ids
    gen = speculative.generate(model, prompt, _rejected_drafter(), draft_max=4, max_tokens=n, temperature=0.0,
                               logit_bias=no_end)
    got = list(gen.complete().token_ids)
    want = list(want)
    if got != want:
        i = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        raise AssertionError(f"{name}: speculative decoding with rejected drafts gives {got}, plain greedy {want} "
                             f"(first difference at generated token {i})")
    t = gen.result.timings
    assert t["spec_drafted"] > 0 and t["spec_acceptance"] < 1.0, f"{name}: no draft was rejected: nothing rewound"


def check_batch_spans(model: Any, ids: np.ndarray, ref: np.ndarray, name: str) -> None:
    """``forward_step_batch_spans`` runs each span in its own slot: = HF for each sequence."""
    a, b = model.init_cache(len(ids)), model.init_cache(len(ids))
    model.forward_step(ids[:10], a)
    got = model.forward_step_batch_spans([ids[10:14], ids[:5]], [a, b], all_logits=True)
    _assert_close(f"{name}: sequence 0 of a batch (positions 10-13) vs HF", got[0], ref[10:14], 10)
    _assert_close(f"{name}: sequence 1 of a batch (positions 0-4) vs HF", got[1], ref[:5], 0)


def check_state_is_fixed(model: Any, name: str) -> None:
    """The stateful slots hold as many state bytes for a context of 20 as for 40."""
    def state(slot: Any) -> int:
        return getattr(slot, "state_bytes", None) or slot.nbytes

    small, big = model.init_cache(20, max_rewind=2), model.init_cache(40, max_rewind=2)
    a, b = [state(s) for s in _stateful_slots(small)], [state(s) for s in _stateful_slots(big)]
    assert a == b, f"{name}: the state grows with the context ({a} bytes at 20 tokens, {b} at 40)"
