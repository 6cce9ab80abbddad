"""Text generation over any Decoder: streaming pieces, stop conditions, a completed result.

    for piece in (g := archrun.generate(model, "Once upon a time", max_tokens=32, seed=1)):
        print(piece, end="")
    g.result.finish_reason   # "stop" (EOS/EOT or a stop string) | "length"

The layers: `make_request` validates options into a `GenerationRequest`; a `Decoding` turns
each step's logits into the next token and the text to stream (sampling, stop strings, UTF-8,
logprobs); `generate`/`chat` drive one Decoding with forward_step, and the server drives many
at once through the model's batch entry. A `PrefixCache` passed as `cache=` is kept between
calls: the next prompt only computes what it does not share with the cached ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from archrun.decoder import Decoder
from archrun.errors import ContextOverflow, InvalidRequest, ModelMismatch, NotGenerative, check_flag, shown
from archrun.generation.fnv import fnv1a64
from archrun.generation.grammar import Constraint, Grammar, make_grammar
from archrun.generation.sampling import Sampler, SamplingParams
from archrun.run.cache import PrefixCache, kv_options
from archrun.text.chat_template import chat_prompt

_SAMPLING_FIELDS = {f.name for f in attrs.fields(SamplingParams)}
MAX_TOP_LOGPROBS = 20


@attrs.frozen
class TokenLogprob:
    """A generated token's log-probability under the model, and the most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


@attrs.frozen
class GenerationResult:
    """The completed generation."""

    text: str
    token_ids: tuple[int, ...]          # generated ids (stop/EOG token excluded)
    finish_reason: str                  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    timings: dict[str, float]           # prompt_s, generate_s, prompt_tok_s, generate_tok_s
    cached_tokens: int = 0              # prompt tokens reused from a PrefixCache (not computed)
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token, when asked for
    tool_calls: tuple[Any, ...] = ()    # archrun.generation.tools.ToolCall parsed from the reply (chat with tools)
    content: str | None = None          # with tools: the reply's text outside its tool calls
    # FNV-1a of each step's logits, when asked for (archrun.generation.fingerprint)
    logit_hashes: tuple[str, ...] | None = None


@attrs.frozen
class GenerationRequest:
    """A validated generation: prompt ids, token budget, stop strings, sampling options."""

    ids: tuple[int, ...]
    budget: int                         # tokens that may be generated (max_tokens, capped by the context)
    stops: tuple[str, ...]
    params: SamplingParams
    logprobs: int | None = None         # alternatives per token to report (0: the chosen one only); None: off
    grammar: Grammar | None = None      # outputs are constrained to this grammar (archrun.generation.grammar)
    n_vocab: int | None = None          # the vocabulary the ids and logit_bias were checked against
    model: Any = None                   # the model's CacheOwner (identity and geometry), when it has one
    logit_hashes: bool = False          # record the FNV-1a hash of every step's logits (result.logit_hashes)


class Generation:
    """An iterator of text pieces; `.result` holds the GenerationResult once it is exhausted."""

    def __init__(self, run: Callable[[Generation], Iterator[str]]):
        self.result: GenerationResult | None = None  # set by `run` when it finishes
        self._pieces = run(self)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def complete(self) -> GenerationResult:
        """Run to the end and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result


def generate(model: Any, prompt: str | Sequence[int], *, max_tokens: int | None = 256,
             stop: Sequence[str] | str | None = None, add_special: bool = True,
             parse_special: bool = False, cache: PrefixCache | None = None,
             logprobs: int | None = None, json_schema: dict | str | None = None,
             grammar: Grammar | None = None, kv_type: str = "f32", logit_hashes: bool = False,
             **sampling: Any) -> Generation:
    """Generate a continuation of `prompt` (text, or token ids) with `model` (any Decoder).

    Sampling options (temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
    frequency_penalty, penalty_last_n, logit_bias, seed) are those of SamplingParams.
    max_tokens None means "until EOS or the context is full".
    cache: a PrefixCache kept across calls (the prompt reuses the prefix it shares with it).
    kv_type: how the cache made here (without `cache`) stores K/V: "f32", "f16" or "q8_0".
    logprobs: report each token's logprob and this many alternatives (result.logprobs).
    logit_hashes: record the FNV-1a hash of every step's logits (result.logit_hashes), which two runs of
    the same model and prompt on one machine class share bit for bit (docs/determinism.md).
    json_schema: a JSON Schema (dict or JSON text) the output must satisfy; grammar: an
    archrun.generation.grammar.Grammar (JSON Schema, Lark or regex). The output is constrained token by
    token and ends only where the grammar is complete (see archrun.generation.grammar).
    archrun.generation.speculative.generate takes the same options and decodes speculatively.
    """
    check_model(model)
    check_prompt(prompt)
    check_prefix_cache(cache)
    grammar = make_grammar(grammar, json_schema)
    kv = kv_options(kv_type)
    tok = model.tokenizer
    add_special, parse_special = check_flag("add_special", add_special), check_flag("parse_special", parse_special)
    ids = list(prompt) if not isinstance(prompt, str) else tok.encode(prompt, add_special, parse_special)
    capacity = cache.capacity if cache is not None else None
    req = make_request(model, ids, max_tokens=max_tokens, stop=stop, logprobs=logprobs, context=capacity,
                       grammar=grammar, logit_hashes=logit_hashes, **sampling)
    return Generation(lambda gen: _run(gen, model, req, cache, kv))


def check_model(model: Any) -> None:
    """InvalidRequest unless `model` is a Decoder (a loaded archrun model, or anything with its interface);
    NotGenerative for an encoder (it embeds: archrun.embed)."""
    if not isinstance(model, Decoder):
        raise InvalidRequest(f"model must be a model archrun.load returned, got {type(model).__name__}")
    if getattr(model, "causal", True) is False:
        raise NotGenerative(f"{model.descriptor.architecture} is an encoder (bidirectional attention): it embeds "
                            "text (archrun.embed) and cannot generate")


def check_prompt(prompt: Any) -> None:
    """InvalidRequest unless `prompt` is text or a sequence of token ids (checked further by make_request)."""
    if isinstance(prompt, bytes | bytearray):
        raise InvalidRequest("prompt must be text or a sequence of token ids, not bytes")
    if not isinstance(prompt, str | list | tuple | range | np.ndarray):
        raise InvalidRequest(f"prompt must be text or a sequence of token ids, got {type(prompt).__name__}")
    if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
        raise InvalidRequest(f"a prompt of token ids must be 1-D, got an array of shape {prompt.shape}")


def check_prefix_cache(cache: Any) -> None:
    """InvalidRequest unless `cache` is None or a PrefixCache over a cache (KvCache or another Cache)."""
    from archrun.decoder import Cache

    if cache is None:
        return
    if not isinstance(cache, PrefixCache):
        raise InvalidRequest(f"cache must be an archrun.run.cache.PrefixCache, got {type(cache).__name__}")
    if not isinstance(cache.cache, Cache) or not isinstance(cache.ids, list):
        raise InvalidRequest(f"this PrefixCache's cache was replaced by {type(cache.cache).__name__}, which is "
                             "not a model's cache")


def chat(model: Any, messages: Sequence[dict], /, *, template: str | None = None, tools: Any = None,
         tool_choice: Any = None, **options: Any) -> Generation:
    """Generate the assistant's reply to `messages` (list of {"role", "content"} dicts).

    The template is the file's tokenizer.chat_template, else the family's default, else
    `template=`. Options of `generate` go to it (`cache=` keeps the conversation's KV between
    turns, so a turn computes only its new tokens); every other keyword is a template variable
    (e.g. enable_thinking=False for Qwen3's template).
    tools: OpenAI-shaped function tools offered to the model; tool_choice "auto" (the default with
    tools), "none", "required" or {"type": "function", "function": {"name": ...}} (a forced call
    is constrained to the family's tool-call syntax). With tools, the pieces streamed are the
    reply's content and `result.tool_calls` holds the calls (archrun.generation.tools.ToolCall),
    `result.content` the text outside them, `result.text` the raw reply.
    """
    check_model(model)
    generation = {k: v for k, v in options.items() if k in _GENERATE_OPTIONS}
    template_vars = {k: v for k, v in options.items() if k not in _GENERATE_OPTIONS}
    from archrun.generation.tools import check_template_vars, plan_tool_chat

    if tools is None and tool_choice is None:
        check_template_vars(model.tokenizer, template_vars)
        return generate(model, chat_prompt(model, messages, template, **template_vars), **generation)

    plan = plan_tool_chat(model, messages, tools, tool_choice, template, **template_vars)
    if plan.grammar is not None:
        if generation.get("grammar") is not None or generation.get("json_schema") is not None:
            raise InvalidRequest("a forced tool call cannot also take a grammar or json_schema")
        generation["grammar"] = plan.grammar
    inner = generate(model, plan.ids, **generation)
    return inner if plan.format is None else Generation(lambda gen: _tool_reply(gen, inner, plan.format))


_GENERATE_OPTIONS = {"max_tokens", "stop", "add_special", "parse_special", "cache", "logprobs", "json_schema",
                     "grammar", "logit_hashes", *_SAMPLING_FIELDS}


def _tool_reply(gen: Generation, inner: Generation, fmt: Any) -> Iterator[str]:
    """The content pieces of `inner`; its result with the parsed tool calls."""
    from archrun.generation.tools import ToolCallStream

    stream = ToolCallStream(fmt)
    for piece in inner:
        content, _ = stream.push(piece)
        if content:
            yield content
    content, _ = stream.finish()
    if content:
        yield content
    gen.result = attrs.evolve(inner.result, tool_calls=tuple(stream.calls), content=stream.content)


def make_request(model: Any, ids: Sequence[int], *, max_tokens: int | None = 256, stop: Any = None,
                 logprobs: int | None = None, context: int | None = None, grammar: Grammar | None = None,
                 logit_hashes: bool = False, **sampling: Any) -> GenerationRequest:
    """Validate a generation against `model` (context: the tokens a cache holds; default n_ctx).

    Raises InvalidRequest for options out of range and ContextOverflow when the prompt leaves
    no room to generate. The budget is max_tokens capped by the room left in the context.
    """
    unknown = set(sampling) - _SAMPLING_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown generation option(s): {', '.join(sorted(unknown))}")
    check_model(model)
    params = SamplingParams(**sampling)
    stops = _check_stops(stop)
    ids = _check_prompt_ids(ids, model.descriptor.n_vocab)
    if context is not None and not _is_int(context, 1):
        raise InvalidRequest(f"context must be a positive number of tokens, got {shown(context)}")
    n_ctx = context or model.descriptor.n_ctx
    if len(ids) >= n_ctx:
        raise ContextOverflow(f"the prompt has {len(ids)} tokens; the context holds {n_ctx}")
    if max_tokens is not None and not _is_int(max_tokens, 1):
        raise InvalidRequest(f"max_tokens must be a positive integer, got {shown(max_tokens)}")
    if logprobs is not None and not _is_int(logprobs, 0, MAX_TOP_LOGPROBS):
        raise InvalidRequest(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {shown(logprobs)}")
    room = n_ctx - len(ids)
    budget = room if max_tokens is None else min(int(max_tokens), room)
    Sampler(params, model.descriptor.n_vocab)  # validates logit_bias against the vocabulary
    return GenerationRequest(ids=tuple(ids), budget=budget, stops=stops, params=params,
                             logprobs=None if logprobs is None else int(logprobs),
                             grammar=make_grammar(grammar), n_vocab=model.descriptor.n_vocab,
                             model=getattr(model, "cache_owner", None),
                             logit_hashes=check_flag("logit_hashes", logit_hashes))


def _is_int(x: Any, lo: int, hi: int | None = None) -> bool:
    ok = isinstance(x, int | np.integer) and not isinstance(x, bool) and x >= lo
    return ok and (hi is None or x <= hi)


def _check_prompt_ids(ids: Sequence[int], n_vocab: int) -> list[int]:
    if isinstance(ids, str | bytes | bytearray) or not isinstance(ids, Sequence | np.ndarray | range):
        raise InvalidRequest(f"prompt token ids must be a sequence of integers, got {type(ids).__name__}")
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise InvalidRequest(f"prompt token ids must be 1-D, got an array of shape {ids.shape}")
    if len(ids) == 0:
        raise InvalidRequest("the prompt is empty")
    if not all(_is_int(t, 0) for t in ids):
        raise InvalidRequest("prompt token ids must be non-negative integers")
    out = [int(t) for t in ids]
    if max(out) >= n_vocab:
        raise InvalidRequest(f"prompt token id {max(out)} is outside the vocabulary [0, {n_vocab})")
    return out


def _check_stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list | tuple) or len(stop) > 16:
        raise InvalidRequest("stop must be a string or a list of at most 16 strings")
    if not all(isinstance(s, str) and 0 < len(s) <= 256 for s in stop):
        raise InvalidRequest("every stop string must be a non-empty string of at most 256 characters")
    return tuple(stop)


def check_decoding(tokenizer: Any, request: Any, n_vocab: Any) -> None:
    """A Decoding's parts agree: a GenerationRequest made for a model with this vocabulary (ModelMismatch
    naming both sizes otherwise), a tokenizer that fits in it."""
    if not isinstance(request, GenerationRequest):
        raise InvalidRequest(f"request must be a GenerationRequest from make_request, got {type(request).__name__}")
    if not _is_int(n_vocab, 1):
        raise InvalidRequest(f"n_vocab must be a positive integer, got {shown(n_vocab)}")
    if not all(hasattr(tokenizer, name) for name in ("eog_ids", "incremental", "n_vocab", "token_to_piece")):
        raise InvalidRequest(f"tokenizer must be an archrun.Tokenizer, got {type(tokenizer).__name__}")
    if request.n_vocab is not None and request.n_vocab != n_vocab:
        raise ModelMismatch(f"this request was made for a model with a vocabulary of {request.n_vocab} tokens, "
                            f"not {int(n_vocab)}: make it with make_request(model, ...) for the model that runs it")
    if request.ids and max(request.ids) >= n_vocab:
        raise ModelMismatch(f"the request's prompt holds id {max(request.ids)}, outside this vocabulary "
                            f"[0, {int(n_vocab)})")


def check_request_for(model: Any, request: Any) -> None:
    """ModelMismatch unless `request` was made by make_request for `model` (or a model of the same file
    and geometry)."""
    if not isinstance(request, GenerationRequest):
        raise InvalidRequest(f"request must be a GenerationRequest from make_request, got {type(request).__name__}")
    owner = getattr(model, "cache_owner", None)
    if request.model is not None and owner is not None and request.model != owner:
        raise ModelMismatch(f"this request was made for model {request.model.describe()}, not for "
                            f"{owner.describe()}: make it with make_request(model, ...) for the model that runs it")
    check_decoding(model.tokenizer, request, model.descriptor.n_vocab)


class Decoding:
    """One sequence being generated: each step's logits in, the next token and text out.

    `accept(logits)` samples the next token and returns the text that is now safe to stream
    (never broken UTF-8, never part of a stop string). Once `done`, nothing more is fed;
    otherwise `next_ids` is what the model must append before the next `accept`.
    """

    def __init__(self, tokenizer: Any, request: GenerationRequest, n_vocab: int):
        check_decoding(tokenizer, request, n_vocab)
        self.request = request
        self.sampler = Sampler(request.params, n_vocab)
        self.eog = tokenizer.eog_ids
        self.detok = tokenizer.incremental()
        self.history = list(request.ids)
        self.out_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if request.logprobs is not None else None
        self.logit_hashes: list[str] | None = [] if request.logit_hashes else None
        self.text, self.emitted = "", 0     # text so far; chars of it already returned
        self.done, self.finish_reason = False, "length"
        self.constraint = None if request.grammar is None else Constraint(request.grammar, tokenizer, n_vocab)

    @property
    def next_ids(self) -> list[int]:
        """The ids to append before the next accept (the token just sampled)."""
        return self.out_ids[-1:]

    def accept(self, logits: np.ndarray) -> str:
        """Sample from logits [vocab]; return the newly streamable text ('' if none yet)."""
        nxt = self.sampler(logits, self.history)
        if self.constraint is not None:
            nxt = self.constraint.choose(nxt, logits, lambda masked: self.sampler(masked, self.history))
        return self.push(nxt, logits)

    def push(self, nxt: int, logits: np.ndarray) -> str:
        """Take `nxt` as the next token (chosen from logits [vocab], e.g. by speculative decoding's
        acceptance rule); return the newly streamable text ('' if none yet)."""
        if not _is_int(nxt, 0, self.sampler.n_vocab - 1):
            raise InvalidRequest(f"the next token must be an id in [0, {self.sampler.n_vocab}), got {shown(nxt)}")
        nxt = int(nxt)
        if self.logprobs is not None:
            self.sampler.check_logits(logits)
        if self.logit_hashes is not None:
            self.logit_hashes.append(fnv1a64(logits))
        if nxt in self.eog:
            return self._finish("stop")
        if self.constraint is not None:
            self.constraint.consume(nxt)
        if self.logprobs is not None:
            self.logprobs.append(_logprob(logits, nxt, self.request.logprobs))
        self.out_ids.append(nxt)
        self.history.append(nxt)
        self.text += self.detok.push(nxt)
        cut = _find_stop(self.text, self.request.stops, self.emitted)
        if cut is not None:
            self.text = self.text[:cut]
            return self._finish("stop")
        if self.constraint is not None and self.constraint.finished:  # only the end may follow
            self.text += self.detok.flush()
            return self._finish("stop")
        if len(self.out_ids) >= self.request.budget:
            self.text += self.detok.flush()
            cut = _find_stop(self.text, self.request.stops, self.emitted)
            if cut is not None:
                self.text = self.text[:cut]
            return self._finish("stop" if cut is not None else "length")
        safe = len(self.text) - _held_back(self.text, self.request.stops)
        piece = self.text[self.emitted:safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return piece

    def _finish(self, reason: str) -> str:
        self.done, self.finish_reason = True, reason
        piece = self.text[self.emitted:]
        self.emitted = len(self.text)
        return piece

    def result(self, prompt_s: float, gen_s: float, cached_tokens: int = 0) -> GenerationResult:
        """The GenerationResult (call once done)."""
        n_prompt = len(self.request.ids)
        return GenerationResult(
            text=self.text, token_ids=tuple(self.out_ids), finish_reason=self.finish_reason,
            prompt_tokens=n_prompt, completion_tokens=len(self.out_ids),
            timings=_timings(n_prompt - cached_tokens, len(self.out_ids), prompt_s, gen_s),
            cached_tokens=cached_tokens, logprobs=None if self.logprobs is None else tuple(self.logprobs),
            logit_hashes=None if self.logit_hashes is None else tuple(self.logit_hashes),
        )


def _logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The model's log-softmax at `token` and its n_top most likely tokens."""
    x = np.asarray(logits, dtype=np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    top: tuple[tuple[int, float], ...] = ()
    if n_top:
        best = np.argpartition(-x, n_top - 1)[:n_top]
        best = best[np.argsort(-x[best], kind="stable")]
        top = tuple((int(i), float(x[i] - lse)) for i in best)
    return TokenLogprob(token=token, logprob=float(x[token] - lse), top=top)


def _run(gen: Generation, model: Any, req: GenerationRequest, cache: PrefixCache | None,
         kv: dict | None = None) -> Iterator[str]:
    """The generation loop: prefill what the cache lacks, then sample/step until done."""
    dec = Decoding(model.tokenizer, req, model.descriptor.n_vocab)
    cache = cache if cache is not None else PrefixCache(model.init_cache(len(req.ids) + req.budget, **(kv or {})))
    feed = cache.prepare(req.ids)
    t0 = time.perf_counter()
    logits = _step(model, cache, feed)
    t1 = time.perf_counter()
    while True:
        piece = dec.accept(logits)
        if piece:
            yield piece
        if dec.done:
            break
        logits = _step(model, cache, dec.next_ids)
    gen.result = dec.result(t1 - t0, time.perf_counter() - t1, cached_tokens=len(req.ids) - len(feed))


def _step(model: Any, cache: PrefixCache, ids: list[int]) -> np.ndarray:
    """Append ids to the cache; last-position logits. A step cut short leaves the cache empty."""
    try:
        logits = model.forward_step(np.asarray(ids, dtype=np.int64), cache.cache)
    except BaseException:
        cache.reset()  # ring slots may hold rows of the unfinished step
        raise
    cache.fed(ids)
    return logits


def _find_stop(text: str, stops: tuple[str, ...], emitted: int) -> int | None:
    """Index where the earliest stop string starts (searching only text not yet yielded)."""
    hits = [i for s in stops if (i := text.find(s, max(0, emitted - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing chars could still begin a stop string (kept back from the stream)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best


def _timings(n_prompt: int, n_gen: int, prompt_s: float, gen_s: float) -> dict[str, float]:
    return {
        "prompt_s": prompt_s,
        "generate_s": gen_s,
        "prompt_tok_s": n_prompt / prompt_s if prompt_s > 0 else 0.0,
        "generate_tok_s": n_gen / gen_s if gen_s > 0 else 0.0,
    }
