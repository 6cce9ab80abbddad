"""Text generation over any Decoder: streaming pieces, stop conditions, a completed result.

    for piece in (g := archrun.generate(model, "Once upon a time", max_tokens=32, seed=1)):
        print(piece, end="")
    g.result.finish_reason   # "stop" (EOS/EOT or a stop string) | "length"
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from archrun.errors import ContextOverflow, InvalidRequest
from archrun.sampling import Sampler, SamplingParams

_SAMPLING_FIELDS = {f.name for f in attrs.fields(SamplingParams)}


@attrs.frozen
class GenerationResult:
    """The completed generation."""

    text: str
    token_ids: tuple[int, ...]          # generated ids (stop/EOG token excluded)
    finish_reason: str                  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    timings: dict[str, float]           # prompt_s, generate_s, prompt_tok_s, generate_tok_s


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
             parse_special: bool = False, **sampling: Any) -> Generation:
    """Generate a continuation of `prompt` (text, or token ids) with `model` (any Decoder).

    Sampling options (temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
    frequency_penalty, penalty_last_n, logit_bias, seed) are those of SamplingParams.
    max_tokens None means "until EOS or the context is full".
    """
    tok = model.tokenizer
    ids = list(prompt) if not isinstance(prompt, str) else tok.encode(prompt, add_special, parse_special)
    return _start(model, ids, max_tokens, stop, sampling)


def chat(model: Any, messages: Sequence[dict], *, template: str | None = None, **options: Any) -> Generation:
    """Generate the assistant's reply to `messages` (list of {"role", "content"} dicts).

    The template is the file's tokenizer.chat_template, else the family's default, else
    `template=`. Other options are those of `generate`.
    """
    from archrun.chat_template import chat_tokens

    template = template or model.chat_template
    ids = chat_tokens(model.tokenizer, list(messages), template=template, add_generation_prompt=True)
    max_tokens = options.pop("max_tokens", 256)
    stop = options.pop("stop", None)
    return _start(model, ids, max_tokens, stop, options)


def _start(model: Any, ids: list[int], max_tokens: int | None, stop: Any, sampling: dict) -> Generation:
    unknown = set(sampling) - _SAMPLING_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown generation option(s): {', '.join(sorted(unknown))}")
    params = SamplingParams(**sampling)
    stops = _check_stops(stop)
    n_ctx = model.descriptor.n_ctx
    if not ids:
        raise InvalidRequest("the prompt is empty")
    if len(ids) >= n_ctx:
        raise ContextOverflow(f"the prompt has {len(ids)} tokens; the context holds {n_ctx}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise InvalidRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
    budget = n_ctx - len(ids) if max_tokens is None else min(max_tokens, n_ctx - len(ids))
    sampler = Sampler(params, model.descriptor.n_vocab)
    return Generation(lambda gen: _run(gen, model, ids, budget, stops, sampler))


def _check_stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or len(stop) > 16:
        raise InvalidRequest("stop must be a string or a list of at most 16 strings")
    if not all(isinstance(s, str) and 0 < len(s) <= 256 for s in stop):
        raise InvalidRequest("every stop string must be a non-empty string of at most 256 characters")
    return tuple(stop)


def _run(gen: Generation, model: Any, ids: list[int], budget: int, stops: tuple[str, ...],
         sampler: Sampler) -> Iterator[str]:
    """The generation loop: prefill, then sample/step until EOG, a stop string or the budget."""
    tok = model.tokenizer
    eog = tok.eog_ids
    cache = model.init_cache(len(ids) + budget)
    t0 = time.perf_counter()
    logits = model.forward_step(np.asarray(ids), cache)
    t1 = time.perf_counter()
    history, out_ids = list(ids), []
    text, emitted = "", 0                     # text so far; chars of it already yielded
    detok = tok.incremental()
    finish = "length"
    while len(out_ids) < budget:
        nxt = sampler(logits, history)
        if nxt in eog:
            finish = "stop"
            break
        out_ids.append(nxt)
        history.append(nxt)
        text += detok.push(nxt)
        cut = _find_stop(text, stops, emitted)
        if cut is not None:
            text, finish = text[:cut], "stop"
            break
        safe = len(text) - _held_back(text, stops)
        if safe > emitted:
            yield text[emitted:safe]
            emitted = safe
        if len(out_ids) < budget:
            logits = model.forward_step([nxt], cache)
    else:
        text += detok.flush()
    if finish == "length" and stops:
        cut = _find_stop(text, stops, emitted)
        if cut is not None:
            text, finish = text[:cut], "stop"
    if len(text) > emitted:
        yield text[emitted:]
    t2 = time.perf_counter()
    gen.result = GenerationResult(
        text=text, token_ids=tuple(out_ids), finish_reason=finish, prompt_tokens=len(ids),
        completion_tokens=len(out_ids), timings=_timings(len(ids), len(out_ids), t1 - t0, t2 - t1),
    )


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
