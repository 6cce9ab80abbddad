"""What a drafter is and returns: the `Drafter` contract, a round's `Draft`, the draft's own sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from archrun.errors import PluginError
from archrun.generation.generate import (
    Decoding,
)
from archrun.generation.sampling import Sampler

MAX_DRAFT = 16  # most tokens a round may draft (a cache keeps at least 2 * MAX_DRAFT rows of rewind)


@attrs.frozen
class Draft:
    """Tokens a drafter guesses, with the distributions they were drawn from.

    probs [k, vocab] (float64) are the drafter's q for each token; None means the tokens were
    picked deterministically (q is one-hot at each token), as n-gram lookup or greedy drafting does.
    """

    tokens: tuple[int, ...] = ()
    probs: np.ndarray | None = None


class DraftSampler:
    """How a drafter picks its tokens: the target's sampling options on a separate random stream."""

    def __init__(self, sampler: Sampler, seed: int | None):
        self.greedy = sampler.params.greedy
        self._chain = sampler
        self.rng = np.random.default_rng(seed)

    def draw(self, logits: np.ndarray, history: Sequence[int]) -> tuple[int, np.ndarray | None]:
        """(token, q [vocab] or None when greedy) from a drafter's logits [vocab]."""
        if self.greedy:
            return self._chain(logits, history), None
        q = self._chain.distribution(logits, history)
        return int(self.rng.choice(len(q), p=q)), q


class Drafter:
    """Proposes draft tokens for a target model. Subclass and override `propose`.

    A drafter that must see the target's steps (a head reading the trunk's hidden states)
    overrides `step`, `rewind` and `reset` and sets `follows_trunk`; the others keep the defaults.
    """

    name = "drafter"
    follows_trunk = False  # True: every target step goes through `step` (the drafter keeps state in step)

    def start(self, model: Any, capacity: int) -> None:
        """A generation starts: the target's cache holds up to `capacity` tokens."""

    def propose(self, history: Sequence[int], k: int, sampler: DraftSampler) -> Draft:
        """Up to k tokens guessed to follow `history` (prompt + generated ids, the last not yet fed)."""
        raise NotImplementedError

    def step(self, model: Any, cache: Any, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        """The target step: append ids [n] to cache; logits [n, vocab] (or [1, vocab] of the last).

        A verification step (all_logits) goes through the model's span entry where it has one
        (`caps.batch`): there each row is computed exactly as a one-token step would compute it, so
        greedy speculation keeps plain greedy decoding's tokens bit for bit; other steps (the
        prompt) take forward_step's path, as plain decoding does."""
        if all_logits and len(ids) > 1 and model.caps.batch:
            return model.forward_step_batch_spans([ids], [cache], all_logits=True)[0]
        logits = model.forward_step(ids, cache, all_logits=all_logits)
        return logits if all_logits else logits[None, :]

    def rewind(self, n: int) -> None:
        """The target's cache just forgot its last n tokens."""

    def reset(self) -> None:
        """The target's cache was cleared."""

    def fork(self) -> Drafter:
        """A drafter for another sequence decoded alongside (the server's slots), sharing what can be
        shared. The default returns self: right for drafters that keep no per-sequence state."""
        return self


def propose(drafter: Drafter, dec: Decoding, k: int, draw: DraftSampler, n_vocab: int) -> Draft:
    """The drafter's guess of up to k tokens after dec's history (nothing when k is 0)."""
    return _checked(drafter.propose(dec.history, k, draw), k, n_vocab) if k else Draft()


def _checked(draft: Draft, k: int, n_vocab: int) -> Draft:
    """A drafter's proposal, refused (PluginError) unless it is at most k ids of the vocabulary."""
    toks = tuple(int(t) for t in draft.tokens)
    if len(toks) > k or any(not 0 <= t < n_vocab for t in toks):
        raise PluginError(f"a drafter proposed {list(toks)!r}: at most {k} ids in [0, {n_vocab}) were asked for")
    if draft.probs is not None and np.shape(draft.probs) != (len(toks), n_vocab):
        raise PluginError(f"a drafter's probs have shape {np.shape(draft.probs)}, expected {(len(toks), n_vocab)}")
    return Draft(toks, draft.probs)
