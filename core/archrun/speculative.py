"""Speculative decoding over any Decoder whose cache rewinds: draft k tokens, verify them in one step.

    from archrun import speculative
    gen = speculative.generate(model, prompt, "lookup", max_tokens=128, temperature=0)
    gen.complete().timings["spec_acceptance"]   # accepted / drafted

Each round a drafter guesses the next k tokens cheaply; one multi-token target step over
[last token, *drafts] yields the target's logits at every drafted position; the longest prefix
the target agrees with is kept, the target's own token follows it, and the cache is rewound
past the rejected tail (O(1)). Greedy decoding keeps a draft iff it equals the target's choice,
so the text equals plain greedy decoding token for token: a verification step goes through the
model's span entry (`forward_step_batch_spans`), where a fused model computes every row exactly as
its one-token step does (the same bits, quantized weights included: kernels.layer.decode_rows).
Where a target has no such exact span path (layers run op by op: a mixture-of-experts FFN with its
own kernel, token mixers, ops without kernel parts, a cache of another kv type than float32) the
span's logits round like a prefill's, and a near-tie may resolve the other way. Sampled decoding
uses the standard rejection rule
(accept x with probability min(1, p(x)/q(x)), else draw from max(p - q, 0)), so each token
follows the target's distribution p whatever the drafter proposes.

Drafters are plugins (hook `archrun_register_drafters`): "lookup" (n-gram match in the prompt
and output) and "draft:PATH" (a smaller model with the same vocabulary) are built in; family
plugins add drafters that need their own heads (e.g. a multi-token-prediction head, "mtp").
The draft length adapts to the acceptance measured per draft depth and the measured cost of
each round length (`AdaptiveLength`). `Speculation` is the per-sequence state the server's batch engine uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from archrun.cache import PrefixCache, kv_options, restore_point, rewind_to
from archrun.errors import InvalidRequest, ModelMismatch, PluginError, VocabularyMismatch, check_flag
from archrun.generation import (
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
from archrun.sampling import Sampler

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


# -- entries ------------------------------------------------------------------------------------


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


# -- the rounds ---------------------------------------------------------------------------------


class AdaptiveLength:
    """Draft length from the acceptance per draft depth and the measured cost of each round length.

    p[i] is the chance that draft i + 1 is kept given that the drafts before it were (the target
    tested it), estimated per depth from the tested drafts: a round that keeps j of its k drafts
    saw depths 1..j agree and, when j < k, depth j + 1 disagree; the drafts after the first
    rejected one were never tested and count nowhere. Acceptance is not one independent rate:
    a lookup either copies (every depth agrees) or not (the first draft fails), so depth 1 is
    uncertain while the deeper depths, tested only once the first agreed, are mostly kept.
    Each depth's counts decay by `decay` with each new observation of it. Depth 1 starts from a
    prior of `prior` drafts at `rate`, decaying with its counts (its estimate can reach 0 or 1
    where the drafts always fail or always agree); each deeper depth leans on the depth before
    it with a lasting weight of `pool` drafts (a depth not yet tested takes the shallower
    depth's rate, and one miss at a depth tested once does not make it a wall: the end of a
    copied run falls at any depth).

    A round of k drafts decides E(k) = 1 + p[0] + p[0] p[1] + ... + p[0]..p[k-1] tokens and costs
    t(k) seconds (drafting and the target step of 1 + k rows), measured per k as generation goes
    (an exponential average; a step's cost is not linear in its rows: the op-by-op span path gets
    dearer per row as the span grows). A k not measured yet is priced from the measured ones:
    linearly between two of them (an over-estimate where the cost is convex), beyond the longest
    with the slope between the two longest (the steepest, where the cost is convex), below the
    shortest (or with nothing measured) by the shape 1 + k / 4; a longer round never counts as
    cheaper than a shorter one. The round drafts
    the k in [0, k_max] deciding the most tokens per second; while that is 0, every `probe`-th
    round drafts one token to keep testing (text turns repetitive, drafts start to agree).

    One-off costs (the first call of a step shape, another process taking the cores) are
    bounded: a sample counts at most `spike` times the current estimate, and a k's first sample,
    when dearer than its estimate, moves the estimate by the weight `w` only. The load moves every
    length alike: a sample's ratio to its estimate moves the other measured lengths by the weight
    `w_load` (a length not drafted for a while does not keep the load of its last measurement),
    and a sample cheaper than the estimate of a shorter round moves that one down by `w`.
    """

    def __init__(self, k_max: int = 5, rate: float = 0.6, decay: float = 0.7, probe: int = 4,
                 prior: float = 1.0, pool: float = 2.0, spike: float = 2.0, w: float = 0.3, w_load: float = 0.1):
        if isinstance(k_max, bool) or not isinstance(k_max, int) or not 1 <= k_max <= MAX_DRAFT:
            raise InvalidRequest(f"the draft length must be an integer in [1, {MAX_DRAFT}], got {k_max!r}")
        self.k_max, self.rate0, self.decay, self.probe = k_max, rate, decay, probe
        self.spike, self.w, self.w_load = spike, w, w_load
        self.kept = np.zeros(k_max)              # [k_max] decayed counts of kept drafts per depth
        self.tested = np.zeros(k_max)            # [k_max] decayed counts of tested drafts per depth
        self.weight = np.full(k_max, float(pool))   # [k_max] each depth's prior, in drafts
        self.weight[0] = prior                        # (depth 1's decays with its counts)
        self.cost_s = np.full(k_max + 1, np.nan)  # [k_max + 1] seconds of a round of k drafts (nan: unmeasured)
        self.rounds = 0

    def acceptance(self) -> np.ndarray:
        """p [k_max]: P(draft i + 1 kept | drafts 1..i kept), each depth on its shallower neighbour's prior."""
        p = np.empty(self.k_max)
        prev = self.rate0
        for i in range(self.k_max):
            w = self.weight[i]
            prev = p[i] = (self.kept[i] + w * prev) / (self.tested[i] + w) if self.tested[i] + w > 0 else prev
        return p

    @property
    def rate(self) -> float:
        """The first draft's acceptance rate (whether the drafter's guesses agree at all)."""
        return float(self.acceptance()[0])

    def expected(self) -> np.ndarray:
        """E [k_max + 1]: tokens a round of k drafts decides, k = 0..k_max."""
        return 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(self.acceptance()))])

    def costs(self) -> np.ndarray:
        """t [k_max + 1]: seconds of a round of k drafts, measured or priced from the measured ones
        (relative 1 + k / 4 while nothing is measured); non-decreasing in k."""
        ks = np.arange(self.k_max + 1, dtype=np.float64)
        known = np.flatnonzero(~np.isnan(self.cost_s))
        if not len(known):
            return 1.0 + ks / 4
        c = self.cost_s[known]
        lo, hi = known[0], known[-1]
        t = np.interp(ks, known, c)                                   # linear between measured lengths
        slope = (c[-1] - c[-2]) / (hi - known[-2]) if len(known) > 1 else c[0] / (4 + lo)
        t[hi + 1:] = c[-1] + (ks[hi + 1:] - hi) * max(slope, 0.0)    # beyond: the longest measured slope
        t[:lo] = c[0] * (4 + ks[:lo]) / (4 + lo)                      # below: the prior's shape
        return np.maximum.accumulate(t)

    @property
    def k(self) -> int:
        """The draft length deciding the most tokens per second (0: drafting does not pay)."""
        return int(np.argmax(self.expected() / self.costs()))

    def next(self) -> int:
        """Tokens to draft this round (0: a plain step). Call once per round."""
        self.rounds += 1
        if self.rounds == 1 and np.isnan(self.cost_s).all():
            return 0  # a plain step first: it measures what a step costs
        k = self.k
        return k if k or self.rounds % self.probe else 1

    def update(self, drafted: int, accepted: int) -> None:
        """A round drafted `drafted` tokens and the target kept `accepted` of them."""
        tested = min(accepted + 1, drafted)               # depths 1..accepted kept, the next one (if any) not
        self.kept[:tested] *= self.decay
        self.tested[:tested] *= self.decay
        self.weight[:min(tested, 1)] *= self.decay
        self.kept[:accepted] += 1.0
        self.tested[:tested] += 1.0

    def observe(self, rows: int, step_s: float, drafted: int, draft_s: float) -> None:
        """A round drafted `drafted` tokens in draft_s seconds and its target step of `rows` rows took step_s."""
        k, sample, w = rows - 1, step_s + draft_s, self.w
        if not 0 <= k <= self.k_max:
            return
        if np.isnan(self.cost_s).all():
            self.cost_s[k] = sample
            return
        est = self.costs()[k] if np.isnan(self.cost_s[k]) else self.cost_s[k]
        bounded = min(sample, self.spike * est)
        others = ~np.isnan(self.cost_s)
        others[k] = False
        self.cost_s[others] *= 1 + self.w_load * (bounded / est - 1)   # the load moves every length alike
        if np.isnan(self.cost_s[k]):
            self.cost_s[k] = min(sample, (1 - w) * est + w * bounded)
        else:
            self.cost_s[k] = (1 - w) * est + w * bounded
        shorter = self.cost_s[:k]
        dear = shorter > sample                           # nan compares False: unmeasured ones stay so
        shorter[dear] = (1 - w) * shorter[dear] + w * sample


@attrs.define
class Stats:
    """Counters of one speculative generation (reported in GenerationResult.timings)."""

    rounds: int = 0          # target steps after the prompt
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0          # tokens decided by those steps
    draft_s: float = 0.0     # time spent drafting
    last_rejected: int = 0   # drafts the last round rejected (its cache holds them until rewound)

    def timings(self) -> dict[str, float]:
        return {
            "spec_acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "spec_tokens_per_step": self.tokens / self.rounds if self.rounds else 0.0,
            "spec_mean_accepted": self.accepted / self.rounds if self.rounds else 0.0,
            "spec_drafted": float(self.drafted),
            "spec_draft_s": self.draft_s,
        }


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


# -- built-in drafters ----------------------------------------------------------------------------


class LookupDrafter(Drafter):
    """Prompt lookup: propose the tokens that followed the earlier place of the history that best
    matches its end. No second model: it pays off when the output repeats its input (code editing,
    summaries quoting a document).

    A place j (a history position, the candidate counterpart of the last token) matches with the
    length of the run of equal tokens ending there: h[j - m] == h[-1 - m] for m = 0, 1, ...
    (the classic n-gram match, counted up to ngram_max), or, where h[j] differs from the last
    token, the run just before it (h[j - 1 - m] == h[-2 - m]) if it reaches ngram_max: the output
    replaced one token of its source (an edit such as a rename) and goes on copying what followed
    it (shorter runs before a differing token are mostly chance: measured 3 of 65 such drafts kept
    where the output did not copy, 21 of 26 where it did). Exact runs shorter than ngram_min do
    not count; a substitution's run ranks after an exact run of the same length.
    Ties go to the place whose last `window` tokens agree with the history's in most positions
    (the same spot of the source, when a short n-gram occurs several times), then to the latest.

    With `renames`, the substitutions it matched are remembered for the rest of the generation
    (source token -> output token) once the output went on with the token that followed the
    source's (a one-for-one replacement, not a rewrite that happened to share 4 tokens before
    it): a history token that replaced a source token also matches that source token
    (`revenue +=` matches the source's `total +=`), and a draft copied from the source carries
    the replacements (a later `total` is drafted as `revenue`). The map is per sequence (`fork`)
    and starts empty with each generation (`start`).
    """

    name = "lookup"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 2, window: int = 16, renames: bool = True):
        if not (isinstance(ngram_min, int) and isinstance(ngram_max, int) and 1 <= ngram_min <= ngram_max):
            raise InvalidRequest(f"lookup needs 1 <= ngram_min <= ngram_max, got {ngram_min!r}, {ngram_max!r}")
        self.ngram_max, self.ngram_min, self.window = ngram_max, ngram_min, max(window, ngram_max + 1)
        self.use_renames = renames
        self.renames: dict[int, int] = {}   # source token -> the token the output put in its place
        self.pending: tuple[int, int, int, int] | None = None   # (position, src, last, src's successor)

    def start(self, model: Any, capacity: int) -> None:
        self.renames, self.pending = {}, None

    def fork(self) -> LookupDrafter:
        return LookupDrafter(self.ngram_max, self.ngram_min, self.window, self.use_renames)

    def propose(self, history: Sequence[int], k: int, sampler: DraftSampler) -> Draft:
        h = np.asarray(history, dtype=np.int64)
        if self.pending is not None and len(h) > self.pending[0]:
            at, src, last, then = self.pending   # confirmed if the output went on with the source's next token
            if h[at] == then:
                self.renames[src] = last
            self.pending = None
        alias = None
        if self.renames:   # h with each replacing token read as the source token it replaced (-1: none)
            alias = np.full(len(h), -1, dtype=np.int64)
            for src, new in self.renames.items():
                alias[h == new] = src
        j = best_match(h, self.ngram_min, self.ngram_max, self.window, sub_min=self.ngram_max, alias=alias)
        if j is None:
            return Draft()
        src, last = int(h[j]), int(h[-1])
        if self.use_renames and src != last and (alias is None or alias[-1] != src) :
            self.pending = (len(h), src, last, int(h[j + 1]))   # a substitution matched: src -> last?
        return Draft(tuple(self.renames.get(int(t), int(t)) for t in h[j + 1:j + 1 + k]))


def best_match(h: np.ndarray, ngram_min: int, ngram_max: int, window: int, sub_min: int | None = None,
               alias: np.ndarray | None = None) -> int | None:
    """The place j < len(h) - 1 whose tokens best match the end of h (LookupDrafter's rule), or None;
    a substitution counts when its run reaches sub_min (default ngram_min). alias [len(h)] (or
    None) is a second token each history position matches as (-1: none): a rename's source.

    eq[j, m] = h[j - m] matches h[-1 - m] for m < window ([len(h) - 1, window] booleans; positions
    before the start never match), so the exact run is eq's leading Trues and a substitution's
    run the leading Trues of eq[:, 1:] where eq[:, 0] is False.
    """
    n = len(h) - 1                                             # places with a successor
    if n < 1:
        return None
    pad = np.concatenate([np.full(window - 1, -1, dtype=np.int64), h])
    places = np.lib.stride_tricks.sliding_window_view(pad[:n + window - 1], window)[:, ::-1]   # [n, window]
    tail = pad[-window:][::-1]                                 # h[-1], h[-2], ... ([window])
    eq = (places == tail) & (tail >= 0)
    if alias is not None:
        alias_tail = np.concatenate([np.full(window - 1, -1, dtype=np.int64), alias])[-window:][::-1]
        eq |= (places == alias_tail) & (alias_tail >= 0)
    exact = np.minimum(np.cumprod(eq, axis=1).sum(axis=1), ngram_max)
    sub = np.where(eq[:, 0], 0, np.minimum(np.cumprod(eq[:, 1:], axis=1).sum(axis=1), ngram_max))
    sub[sub < max(sub_min or ngram_min, ngram_min)] = 0
    run = np.maximum(2 * exact, 2 * sub - 1)                   # a substitution ranks after an exact run
    run[run < 2 * ngram_min - 1] = 0
    if not run.any():
        return None
    score = (run * (window + 1) + eq.sum(axis=1)) * (n + 1) + np.arange(n)   # run, then agreement, then latest
    return int(np.argmax(score))


class ModelDrafter(Drafter):
    """A smaller model drafting for the target: same vocabulary, its own cache kept in step with
    the history (a PrefixCache: each round rewinds the rejected drafts and feeds what it lacks)."""

    name = "draft"

    def __init__(self, draft_model: Any, target: Any):
        check_vocabulary(draft_model, target)
        self.model, self.target = draft_model, target
        self.cache: PrefixCache | None = None
        self._prefilled: int | None = None  # where the target's prompt step ended (None: not seen)

    def start(self, model: Any, capacity: int) -> None:
        if model is not self.target:
            mine, theirs = getattr(self.target, "cache_owner", None), getattr(model, "cache_owner", None)
            if mine is None or theirs is None or mine != theirs:
                shown_mine = mine.describe() if mine is not None else type(self.target).__name__
                shown_theirs = theirs.describe() if theirs is not None else type(model).__name__
                raise ModelMismatch(f"this draft-model drafter was made for target {shown_mine}, not "
                                    f"{shown_theirs}: make one for this model (make_drafter)")
        cap = min(capacity + 1, self.model.descriptor.n_ctx)
        if self.cache is None or self.cache.capacity < cap:
            self.cache = PrefixCache(self.model.init_cache(cap, max_rewind=max(64, 2 * MAX_DRAFT + 2)))
        self._prefilled = None

    def fork(self) -> ModelDrafter:
        twin = ModelDrafter.__new__(ModelDrafter)
        twin.model, twin.target, twin.cache = self.model, self.target, None   # the same models, a cache of its own
        twin._prefilled = None
        return twin

    def step(self, model: Any, cache: Any, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        """The target step (Drafter.step), noting where its prompt step ends: the draft then prefills the
        same rows and computes the later ones as the target's steps did (`_feed`)."""
        if not all_logits:
            self._prefilled = len(cache) + len(ids)
        return super().step(model, cache, ids, all_logits)

    def propose(self, history: Sequence[int], k: int, sampler: DraftSampler) -> Draft:
        assert self.cache is not None, "start() first"
        k = min(k, self.cache.capacity - len(history))
        if k < 1:
            return Draft()
        hist = [int(t) for t in history]
        _rest(self.target)  # the target's decode workers spin ~3 ms after its step: the draft needs the cores
        logits = self._feed(self.cache.prepare(hist))
        tokens, probs = [], []
        for i in range(k):
            tok, q = sampler.draw(logits, hist + tokens)
            tokens.append(tok)
            probs.append(q)
            if i + 1 < k:
                logits = self._feed([tok])
        _rest(self.model)   # and the target's verify step needs them next
        return Draft(tuple(tokens), None if sampler.greedy else np.stack(probs))

    def _feed(self, ids: Sequence[int]) -> np.ndarray:
        """Append ids to the draft model's cache; its logits [vocab] after the last.

        The draft computes each row as the target did: the rows of the target's prompt step through the
        prefill path, later ones (tokens the target computed in one-token or verify steps) through steps or
        the span entry, which compute every row as a one-token step does. A draft model equal to the
        target then proposes exactly the target's greedy choices (a prefill rounds some rows differently
        from a step), also when the first rounds drafted nothing and the history holds several generated
        tokens. Without the target's prompt step seen (the server prefills prompts in chunks itself), more
        than a round's catch-up is taken as the prompt plus one generated token."""
        if self._prefilled is not None:  # rows [start, prefilled) came from the target's prompt step
            cut = min(max(self._prefilled - len(self.cache.cache), 0), len(ids))
        else:
            cut = len(ids) - 1 if len(ids) > 2 * MAX_DRAFT else 0
        logits = self._append(ids[:cut], prefill=True) if cut else None
        ids = ids[cut:]
        while len(ids) > 2 * MAX_DRAFT:  # the span entry takes a round's catch-up at a time
            self._append(ids[:2 * MAX_DRAFT])
            ids = ids[2 * MAX_DRAFT:]
        return self._append(ids) if len(ids) else logits

    def _append(self, ids: Sequence[int], prefill: bool = False) -> np.ndarray:
        """Append ids to the draft model's cache; its logits [vocab] after the last (prefill: through
        forward_step's path, as the target's prompt step).

        A round's catch-up (the verified tokens the draft has not seen: a few) goes through the
        model's span entry where it has one, as a verify step does (the rows kernel), not through
        forward_step's prefill: right after the target's step that prefill ran 4-8x slower than
        alone (5 rows of SmolLM2-135M Q4_1 next to its F16 target: 90-160 ms, 19 ms alone; the
        span entry 21-28 ms), and 0.2-2 s on a loaded host, which kept the draft length at 0."""
        ids = np.asarray(ids, dtype=np.int64)
        try:
            if not prefill and 1 < len(ids) <= 2 * MAX_DRAFT and self.model.caps.batch:
                logits = self.model.forward_step_batch_spans([ids], [self.cache.cache], all_logits=True)[0][-1]
            else:
                logits = self.model.forward_step(ids, self.cache.cache)
        except BaseException:
            self.cache.reset()
            raise
        self.cache.fed(ids)
        return logits


def _rest(model: Any) -> None:
    """Send a model's spinning decode workers to sleep (two models share the cores in turn)."""
    rest = getattr(model, "rest_workers", None)
    if callable(rest):
        rest()


def check_vocabulary(draft: Any, target: Any) -> None:
    """Raise VocabularyMismatch unless both models have the same vocabulary (size and token texts)."""
    nd, nt = draft.descriptor.n_vocab, target.descriptor.n_vocab
    if nd != nt:
        raise VocabularyMismatch(f"the draft model's vocabulary has {nd} tokens, the target's {nt}: "
                                 "speculative decoding needs one shared vocabulary")
    td, tt = draft.tokenizer, target.tokenizer
    if td is None or tt is None:
        return
    if td.n_vocab != tt.n_vocab:
        raise VocabularyMismatch(f"the draft tokenizer has {td.n_vocab} tokens, the target's {tt.n_vocab}")
    for i in range(td.n_vocab):
        if td.token_text(i) != tt.token_text(i):
            raise VocabularyMismatch(f"token {i} is {td.token_text(i)!r} in the draft model but "
                                     f"{tt.token_text(i)!r} in the target: the vocabularies differ")


# -- the registry -------------------------------------------------------------------------------


def _lookup_factory(model: Any, arg: str | None) -> Drafter:
    if arg:
        raise InvalidRequest(f"the lookup drafter takes no argument, got {arg!r}")
    return LookupDrafter()


def _draft_factory(model: Any, arg: str | None) -> Drafter:
    if not arg:
        raise InvalidRequest("the draft drafter needs a model path: draft:PATH")
    from archrun.api import load

    return ModelDrafter(load(arg), model)


BUILTIN = {
    "lookup": (_lookup_factory, "prompt lookup: n-gram match in the prompt and output"),
    "draft": (_draft_factory, "draft:PATH, a smaller model with the target's vocabulary"),
}


def drafters(plugins: Any = None) -> dict[str, tuple[Callable[[Any, str | None], Drafter], str]]:
    """name -> (factory, doc) of every drafter: the built-in ones and those plugins register."""
    from archrun.plugins import default_plugin_manager

    pm = plugins or default_plugin_manager()
    found = dict(BUILTIN)
    owners = {name: "archrun" for name in found}

    def register(name: str, factory: Callable[[Any, str | None], Drafter], doc: str = "") -> None:
        if not isinstance(name, str) or not name or ":" in name or not callable(factory):
            raise PluginError(f"a drafter needs a name without ':' and a callable factory, got {name!r}")
        if name in found:
            raise PluginError(f"drafter {name!r} is registered by both {owners[name]} and {plugin}")
        found[name], owners[name] = (factory, doc), plugin

    for impl in pm.hook.archrun_register_drafters.get_hookimpls():
        plugin = impl.plugin_name
        impl.function(register)
    return found


def make_drafter(model: Any, spec: str | Drafter, plugins: Any = None) -> Drafter:
    """A Drafter from a spec "NAME" or "NAME:ARG" ("lookup", "draft:PATH", "mtp"), or `spec` itself."""
    if isinstance(spec, Drafter):
        return spec
    if not isinstance(spec, str) or not spec:
        raise InvalidRequest(f"speculative must be a drafter or a spec such as 'lookup', got {spec!r}")
    name, _, arg = spec.partition(":")
    table = drafters(plugins)
    if name not in table:
        raise InvalidRequest(f"unknown drafter {name!r} (installed: {', '.join(sorted(table))})")
    return table[name][0](model, arg or None)
