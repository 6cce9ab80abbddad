"""The speculative loop: draft k tokens, verify them in one target step, keep the agreeing prefix, rewind.

Greedy decoding keeps a draft iff it equals the target's choice; sampled decoding uses the standard
rejection rule, so each token follows the target's distribution. `Speculation` is the per-sequence
state the server's batch engine uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from archrun.errors import InvalidRequest, check_flag
from archrun.generation.generate import (
    Decoding,
    Generation,
    GenerationRequest,
    chat_prompt,
    check_model,
    check_prefix_cache,
    check_prompt,
    check_request_for,
    make_request,
)
from archrun.generation.sampling import Sampler
from archrun.generation.speculative.drafters import make_drafter
from archrun.generation.speculative.drafting import MAX_DRAFT, Draft, Drafter, DraftSampler, propose
from archrun.generation.speculative.lengths import AdaptiveLength, Stats
from archrun.run.cache import PrefixCache, kv_options, restore_point, rewind_to


def generate(model: Any, prompt: str | Sequence[int], drafter: str | Drafter, *, draft_max: int = 5,
             max_tokens: int | None = 256, stop: Sequence[str] | str | None = None, add_special: bool = True,
             parse_special: bool = False, cache: PrefixCache | None = None, logprobs: int | None = None,
             kv_type: str = "f32", **sampling: Any) -> Generation:
    """archrun.generate, decoding speculatively with `drafter` (a spec such as "lookup",
    "draft:PATH", "mtp", or a Drafter), drafting at most draft_max tokens a round.

    Greedy output equals archrun.generate's wherever the verify step's logits agree with the
    one-token step's (exactly on float32 models; on quantized ones the multi-token products round
    differently, so a near-tie may resolve the other way: docs/speculative.md). Sampled output
    follows the same distribution.
    result.timings adds spec_acceptance (accepted / drafted), spec_tokens_per_step (tokens per
    target step after the prompt), spec_mean_accepted (drafts kept per step), spec_drafted and
    spec_draft_s (time spent drafting).
    """
    check_model(model)
    check_prompt(prompt)
    check_prefix_cache(cache)
    check_target(model)
    add_special, parse_special = check_flag("add_special", add_special), check_flag("parse_special", parse_special)
    kv = kv_options(kv_type)  # the target's cache made here (without `cache`); a draft model's stays f32
    length = AdaptiveLength(draft_max)
    ids = list(prompt) if not isinstance(prompt, str) else model.tokenizer.encode(prompt, add_special, parse_special)
    capacity = cache.capacity if cache is not None else None
    req = make_request(model, ids, max_tokens=max_tokens, stop=stop, logprobs=logprobs, context=capacity,
                       **sampling)
    if req.grammar is not None:
        raise InvalidRequest("speculative decoding does not take a grammar (use archrun.generate)")
    chosen = make_drafter(model, drafter)
    return Generation(lambda gen: run(gen, model, req, cache, chosen, length, kv))


def chat(model: Any, messages: Sequence[dict], drafter: str | Drafter, *, template: str | None = None,
         **options: Any) -> Generation:
    """archrun.chat, decoding speculatively (options as `generate`)."""
    check_model(model)
    return generate(model, chat_prompt(model, messages, template), drafter, **options)


def decide(sampler: Sampler, logits: np.ndarray, history: Sequence[int], draft: Draft,
           i: int) -> tuple[int, bool]:
    """The token at draft position i given the target's logits [vocab] there: (token, draft kept).

    i == len(draft.tokens) is the round's bonus position (nothing drafted: a plain draw).
    Greedy: keep the draft iff it is the target's choice. Sampled: keep x with probability
    min(1, p(x)/q(x)); otherwise draw from the residual max(p - q, 0), renormalized. A draft
    picked deterministically (q one-hot at x) makes that rule "draw from p as plain sampling
    does, keep x iff the draw is x" (kept with probability p(x), else a draw from p without x):
    one draw of the sampler's stream per decided token, as plain decoding makes, so a seeded run
    decides the tokens plain seeded sampling does, whatever the draft lengths were.
    """
    if i == len(draft.tokens):
        return sampler(logits, history), False
    x = draft.tokens[i]
    if sampler.params.greedy or draft.probs is None:
        tok = sampler(logits, history)
        return tok, tok == x
    p = sampler.distribution(logits, history)
    q = draft.probs[i]
    if sampler.rng.random() * float(q[x]) < p[x]:
        return x, True
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if total <= 0.0:  # p == q up to rounding: any draw from p is exact
        residual, total = p, p.sum()
    return int(sampler.rng.choice(len(p), p=residual / total)), False


def check_target(model: Any) -> None:
    """Refuse a model whose caps cannot verify drafts (a rewindable cache, all-position logits)."""
    caps = model.caps
    if not (caps.rewind and caps.all_logits):
        raise InvalidRequest(f"speculative decoding needs a model whose cache rewinds and whose steps return "
                             f"every position's logits; this one has {caps}")


def run(gen: Generation, model: Any, req: GenerationRequest, cache: PrefixCache | None,
        drafter: Drafter, length: AdaptiveLength, kv: dict | None = None) -> Iterator[str]:
    """The speculative generation loop (the speculative counterpart of generation's plain loop)."""
    dec = Decoding(model.tokenizer, req, model.descriptor.n_vocab)
    if cache is None:
        room = min(model.descriptor.n_ctx, len(req.ids) + req.budget + length.k_max)
        cache = PrefixCache(model.init_cache(room, max_rewind=max(64, 2 * MAX_DRAFT + 2), **(kv or {})))
    elif drafter.follows_trunk:
        cache.reset()  # the drafter's state must see every token the target's cache holds
    drafter.start(model, cache.capacity)
    draw = DraftSampler(dec.sampler, None if req.params.seed is None else req.params.seed + 1)
    feed = cache.prepare(req.ids)
    t0 = time.perf_counter()
    logits = _step(model, cache, drafter, feed, all_logits=False)[-1]
    t1 = time.perf_counter()
    stats = Stats()
    piece = dec.accept(logits)
    if piece:
        yield piece
    while not dec.done:
        yield from _round(model, cache, drafter, dec, draw, length, stats)
    result = dec.result(t1 - t0, time.perf_counter() - t1, cached_tokens=len(req.ids) - len(feed))
    gen.result = attrs.evolve(result, timings={**result.timings, **stats.timings()})


def _round(model: Any, cache: PrefixCache, drafter: Drafter, dec: Decoding, draw: DraftSampler,
           length: AdaptiveLength, stats: Stats) -> Iterator[str]:
    """One round: draft, verify [last, *drafts] in one target step, keep the agreeing prefix, rewind the rest."""
    k = _draft_room(length.next(), dec, cache)
    t0 = time.perf_counter()
    draft = propose(drafter, dec, k, draw, model.descriptor.n_vocab)
    t1 = time.perf_counter()
    logits = _step(model, cache, drafter, [*dec.next_ids, *draft.tokens], all_logits=True)   # [1 + k, vocab]
    length.observe(len(logits), time.perf_counter() - t1, len(draft.tokens), t1 - t0)
    stats.draft_s += t1 - t0
    for piece in settle(dec, logits, draft, length, stats):
        if piece:
            yield piece
    if not dec.done and stats.last_rejected:
        rewind(model, cache, drafter, stats.last_rejected)


def settle(dec: Decoding, logits: np.ndarray, draft: Draft, length: AdaptiveLength, stats: Stats) -> Iterator[str]:
    """Decide the tokens of a verify step (logits [1 + k, vocab] of [last, *draft.tokens]) into `dec`.

    Yields the text each decided token makes streamable; keeps drafts while the rule accepts them,
    then the target's own token. Afterwards stats.last_rejected drafts are to be rewound.
    """
    kept = 0
    for i in range(len(draft.tokens) + 1):
        tok, ok = decide(dec.sampler, logits[i], dec.history, draft, i)
        stats.tokens += 1
        yield dec.push(tok, logits[i])
        if dec.done or not ok:
            break
        kept += 1
    stats.rounds += 1
    stats.drafted += len(draft.tokens)
    stats.accepted += kept
    stats.last_rejected = len(draft.tokens) - kept
    length.update(len(draft.tokens), kept)


def _draft_room(k: int, dec: Decoding, cache: PrefixCache) -> int:
    """k capped so the verify step fits the cache and drafts no token past the budget."""
    return draft_room(k, dec, cache.capacity - len(cache.cache))


def draft_room(k: int, dec: Decoding, free: int) -> int:
    """k capped so a verify step of 1 + k tokens fits `free` cache rows and drafts no token past
    the generation's budget (the step decides up to k + 1 tokens)."""
    left = dec.request.budget - len(dec.out_ids)        # tokens still to generate, >= 1
    return max(0, min(k, left - 1, free - 1))


def _step(model: Any, cache: PrefixCache, drafter: Drafter, ids: Sequence[int], all_logits: bool) -> np.ndarray:
    """The target appends ids; logits [n or 1, vocab]. A step cut short leaves both caches empty."""
    try:
        logits = drafter.step(model, cache.cache, np.asarray(ids, dtype=np.int64), all_logits)
    except BaseException:
        cache.reset()
        drafter.reset()
        raise
    cache.fed(ids)
    return logits


def rewind(model: Any, cache: PrefixCache, drafter: Drafter, n: int) -> None:
    """Forget the last n tokens. The cache says how far back it can return exactly (its rewind
    reach, else a checkpoint of its stateful slots, else the start); the tokens between that
    point and the target are recomputed."""
    target = len(cache.ids) - n
    if n <= cache.cache.max_rewind:
        cache.cache.rewind(n)
        del cache.ids[-n:]
        drafter.rewind(n)
        return
    keep = cache.ids[:target]
    back = restore_point(cache.cache, target)
    if back == 0 or drafter.follows_trunk:  # a drafter that follows the trunk must see every token again
        cache.reset()
        drafter.reset()
        back = 0
    else:
        drafter.rewind(len(cache.ids) - back)
        rewind_to(cache.cache, back)
        del cache.ids[back:]
    _step(model, cache, drafter, keep[back:], all_logits=False)


class Speculation:
    """One sequence's speculative state inside a batch engine (the server): its drafter, draft
    length, draft sampler and counters. The engine appends `next_ids(...)` to the sequence's
    cache in its batched step, hands the step's logits of those ids to `settle`, then calls
    `rewind` for the rejected drafts."""

    def __init__(self, model: Any, drafter: Drafter, dec: Decoding, draft_max: int, capacity: int):
        if not isinstance(drafter, Drafter) or not isinstance(dec, Decoding):
            raise InvalidRequest("Speculation needs a Drafter and a Decoding")
        check_request_for(model, dec.request)
        self.model, self.drafter, self.dec = model, drafter.fork(), dec
        self.length, self.stats, self.draft = AdaptiveLength(draft_max), Stats(), Draft()
        seed = dec.request.params.seed
        self.draw = DraftSampler(dec.sampler, None if seed is None else seed + 1)
        self.drafter.start(model, capacity)

    def next_ids(self, cache: PrefixCache) -> list[int]:
        """[last token, *drafts] to verify this step."""
        k = _draft_room(self.length.next(), self.dec, cache)
        self.draft = propose(self.drafter, self.dec, k, self.draw, self.model.descriptor.n_vocab)
        return [*self.dec.next_ids, *self.draft.tokens]

    def settle(self, logits: np.ndarray) -> str:
        """Decide this step's tokens from logits [1 + k, vocab]; the text they make streamable."""
        return "".join(settle(self.dec, logits, self.draft, self.length, self.stats))

    def rewind(self, cache: PrefixCache) -> None:
        """Forget the drafts the step rejected (unless the sequence is done)."""
        if not self.dec.done and self.stats.last_rejected:
            rewind(self.model, cache, self.drafter, self.stats.last_rejected)
        self.stats.last_rejected = 0
