"""The built-in drafters and the drafter registry.

"lookup" (`LookupDrafter`: an n-gram match in the prompt and output) and "draft:PATH" (`ModelDrafter`: a
smaller model with the same vocabulary); plugins add more through archrun_register_drafters
(`drafters()`, `make_drafter`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from archrun.errors import InvalidRequest, ModelMismatch, PluginError, VocabularyMismatch
from archrun.generation.speculative.drafting import MAX_DRAFT, Draft, Drafter, DraftSampler
from archrun.run.cache import PrefixCache


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
    if model.caps.workers:
        model.rest_workers()


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
