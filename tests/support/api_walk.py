"""The walk over every public callable's parameters: the targets, each parameter, hostile values, and the call
that must succeed or raise an ArchrunError."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from fuzzing.worker import _Raising  # a value whose every conversion raises (the harness's own)

import archrun
from archrun.describe.compile import describe
from archrun.generation import speculative
from archrun.generation.generate import Decoding, make_request
from archrun.generation.grammar import Constraint, Grammar, make_grammar
from archrun.generation.sampling import Sampler, SamplingParams
from archrun.run.cache import PrefixCache, restore_point, rewind_to
from archrun.text.chat_template import chat_tokens, render_chat
from archrun.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "families/archrun-llama/tests/goldens/llama_gqa.gguf"
NOMIC = ROOT / "families/archrun-bert/tests/goldens/nomic_bert_tiny.gguf"  # states its pooling (mean)
USER = [{"role": "user", "content": "hi"}]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Fresh:
    """A base argument made anew for every call (a cache a step fills, a request a decoding consumes)."""

    def __init__(self, make: Callable[[], Any]):
        self.make = make


def hostile() -> list[Any]:
    """Values of the wrong type or range for (almost) any parameter."""
    return [object(), "x", "", 1.5, math.nan, -1, 0, 2**70, b"x", [], [None], {}, {"x": None}, True,
            np.float32(1), np.array([1.5]), np.zeros((2, 2)), (lambda: 0), _Raising(), {1, 2}, (i for i in range(2))]


def _targets(model, host_model) -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
    """(name, callable, valid keyword arguments); positional-only parameters are passed positionally."""
    tok: Tokenizer = model.tokenizer
    n_vocab = model.descriptor.n_vocab

    def fresh_cache():
        return model.init_cache(16)

    def filled():
        c = model.init_cache(16)
        model.forward_step([1, 2, 3], c)
        return c

    def request():
        return make_request(model, [1, 2], max_tokens=2)

    logits = np.zeros(n_vocab, np.float32)
    encoder = archrun.load(NOMIC, backend="reference")
    return [
        ("load", archrun.load, {"path": LLAMA, "backend": "reference"}),
        ("describe", describe, {"source": LLAMA}),
        ("init_cache", model.init_cache, {"max_tokens": 8}),
        ("forward_step", model.forward_step, {"token_ids": [1, 2], "cache": Fresh(fresh_cache)}),
        ("forward_step_hidden", model.forward_step_hidden, {"token_ids": [1], "cache": Fresh(fresh_cache)}),
        ("logits", model.logits, {"token_ids": [1, 2]}),
        ("hidden_states", model.hidden_states, {"token_ids": [1, 2]}),
        ("embed", archrun.embed, {"model": encoder, "texts": [[1, 2]], "pooling": "mean", "normalize": True}),
        ("forward_step_batch", model.forward_step_batch,
         {"batch": [[1], [2]], "caches": Fresh(lambda: [fresh_cache(), fresh_cache()])}),
        ("forward_step_batch_spans", model.forward_step_batch_spans,
         {"batch": [[1], [2, 3]], "caches": Fresh(lambda: [fresh_cache(), fresh_cache()])}),
        ("host_step", host_model.host_step, {"token_ids": [1], "cache": Fresh(lambda: host_model.init_cache(8))}),
        ("KvCache.rewind", lambda n: filled().rewind(n), {"n": 1}),
        ("KvCache.restore_point", lambda length: filled().restore_point(length), {"length": 1}),
        ("KvCache.can_restore", lambda length: filled().can_restore(length), {"length": 1}),
        ("rewind_to", rewind_to, {"cache": Fresh(filled), "length": 1}),
        ("restore_point", restore_point, {"cache": Fresh(filled), "length": 1}),
        ("PrefixCache", PrefixCache, {"cache": Fresh(fresh_cache)}),
        ("PrefixCache.prepare", lambda prompt: PrefixCache(fresh_cache()).prepare(prompt), {"prompt": [1, 2]}),
        ("PrefixCache.fed", lambda ids: PrefixCache(fresh_cache()).fed(ids), {"ids": [1]}),
        ("generate", lambda **kw: archrun.generate(**kw).complete(),
         {"model": model, "prompt": [1, 2], "max_tokens": 2, "stop": None, "add_special": True,
          "parse_special": False, "cache": None, "logprobs": None, "json_schema": None, "grammar": None,
          "kv_type": "f32", "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
          "repetition_penalty": 1.1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "penalty_last_n": 64,
          "logit_bias": None, "seed": None}),
        ("chat", lambda messages, **kw: archrun.chat(model, messages, **kw).complete(),
         {"messages": USER, "template": CHATML, "tools": None, "tool_choice": None, "max_tokens": 2}),
        ("speculative.generate", lambda **kw: speculative.generate(**kw).complete(),
         {"model": model, "prompt": [1, 2, 1, 2], "drafter": "lookup", "draft_max": 3, "max_tokens": 3,
          "stop": None, "add_special": True, "parse_special": False, "cache": None, "logprobs": None,
          "kv_type": "f32", "temperature": 0.0, "seed": None}),
        ("speculative.chat",
         lambda messages, drafter, **kw: speculative.chat(model, messages, drafter, **kw).complete(),
         {"messages": USER, "drafter": "lookup", "template": CHATML, "max_tokens": 2}),
        ("make_request", lambda **kw: make_request(model, **kw),
         {"ids": [1, 2], "max_tokens": 2, "stop": None, "logprobs": None, "context": None, "grammar": None}),
        ("Decoding", Decoding, {"tokenizer": tok, "request": Fresh(request), "n_vocab": n_vocab}),
        ("Decoding.accept", lambda logits: Decoding(tok, request(), n_vocab).accept(logits), {"logits": logits}),
        ("Decoding.push", lambda nxt, logits: Decoding(tok, request(), n_vocab).push(nxt, logits),
         {"nxt": 3, "logits": logits}),
        ("SamplingParams", SamplingParams, {"temperature": 0.5, "seed": None, "logit_bias": {}}),
        ("Sampler", Sampler, {"params": SamplingParams(), "n_vocab": n_vocab}),
        ("Sampler.__call__", lambda logits, history=(): Sampler(SamplingParams(), n_vocab)(logits, history),
         {"logits": logits, "history": [1, 2]}),
        ("Sampler.distribution",
         lambda logits, history=(): Sampler(SamplingParams(), n_vocab).distribution(logits, history),
         {"logits": logits, "history": [1, 2]}),
        ("Grammar.json_schema", Grammar.json_schema, {"schema": {"type": "string"}}),
        ("Grammar.lark", Grammar.lark, {"text": 'start: "a"'}),
        ("Grammar.regex", Grammar.regex, {"pattern": "a+"}),
        ("make_grammar", make_grammar, {"grammar": None, "json_schema": None}),
        ("Constraint", Constraint, {"grammar": Grammar.regex("a+"), "tokenizer": tok, "n_vocab": n_vocab}),
        ("Tokenizer.from_gguf", Tokenizer.from_gguf, {"path": LLAMA}),
        ("Tokenizer.encode", tok.encode, {"text": "hi", "add_special": True, "parse_special": False,
                                          "plain_spans": ()}),
        ("Tokenizer.decode", tok.decode, {"ids": [1, 2], "skip_special": False}),
        ("Tokenizer.decode_bytes", tok.decode_bytes, {"ids": [1, 2], "skip_special": False}),
        ("Tokenizer.token_to_piece", tok.token_to_piece, {"token_id": 1, "special": True}),
        ("Tokenizer.token_text", tok.token_text, {"token_id": 1}),
        ("Tokenizer.is_control", tok.is_control, {"token_id": 1}),
        ("Tokenizer.incremental", tok.incremental, {"skip_special": False}),
        ("IncrementalDecoder.push", lambda token_id: tok.incremental().push(token_id), {"token_id": 1}),
        ("render_chat", render_chat, {"template": CHATML, "messages": USER, "add_generation_prompt": True,
                                      "bos_token": "", "eos_token": ""}),
        ("chat_tokens", chat_tokens, {"tokenizer": tok, "messages": USER, "template": CHATML,
                                      "add_generation_prompt": True}),
    ]


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    params = inspect.signature(fn).parameters
    positional = [kwargs.pop(n) for n, p in params.items() if p.kind is p.POSITIONAL_ONLY and n in kwargs]
    return fn(*positional, **kwargs)


def _parameters(fn: Callable[..., Any], base: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, default) of every parameter the walk varies: the signature's, plus the options of **kwargs
    the base arguments name."""
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append((name, p.default))
    named = {n for n, _ in out}
    return out + [(name, None) for name in base if name not in named]
