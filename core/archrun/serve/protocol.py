"""OpenAI's wire format: request bodies in (validated), completion objects and stream chunks out.

Unknown fields are ignored, as OpenAI's API does; known fields of the wrong type or out of
range raise InvalidRequest (HTTP 400). Defaults follow OpenAI (temperature 1, top_p 1, no
top_k/min_p); top_k, min_p, repetition_penalty and cache_prompt (default true: reuse the KV of
a cached prefix) are accepted as extensions.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from typing import Any

import attrs

from archrun.errors import InvalidRequest
from archrun.generation.generate import GenerationResult, TokenLogprob
from archrun.generation.grammar import Grammar
from archrun.text.reasoning import EFFORTS

MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_CHOICES = 16  # a chat completion's n: choices decoded together from one computed prompt
ROLES = {"system", "user", "assistant", "tool", "developer"}  # "developer" is rendered as "system"


@attrs.frozen
class Options:
    """What a request asks for beyond the prompt: make_request keyword arguments and output shape."""

    generation: dict[str, Any]        # archrun.generation.generate.make_request keywords
    stream: bool = False
    include_usage: bool = False       # stream_options.include_usage
    logprobs: int | None = None       # alternatives per token (None: no logprobs)
    cache_prompt: bool = True         # reuse a cached prefix of the prompt (False: compute it all)
    n: int = 1                        # choices (chat completions)
    reasoning_budget: int | None = None  # most thinking tokens of a reply (None: no bound)


# --- requests -------------------------------------------------------------------------------


def chat_options(body: dict) -> Options:
    """Options of a /v1/chat/completions body."""
    max_tokens = _get(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", int)
    logprobs = None
    if _get(body, "logprobs", bool):
        logprobs = _get(body, "top_logprobs", int) or 0
        _check_range("top_logprobs", logprobs, 0, MAX_CHAT_TOP_LOGPROBS)
    elif _get(body, "top_logprobs", int):
        raise InvalidRequest("top_logprobs needs logprobs: true")
    n = _get(body, "n", int, 1)
    _check_range("n", n, 1, MAX_CHOICES)
    return attrs.evolve(_options({**body, "n": 1}, max_tokens, logprobs), n=n, reasoning_budget=reasoning_budget(body))


def reasoning_budget(body: dict) -> int | None:
    """The thinking-token budget of a chat body: `reasoning_budget` (archrun's and llama-server's name) or
    OpenRouter's `reasoning.max_tokens`; None when neither is given."""
    budget = _get(body, "reasoning_budget", int)
    if budget is None:
        budget = _get(_get(body, "reasoning", dict) or {}, "max_tokens", int)
    if budget is not None and budget < 0:
        raise InvalidRequest(f"reasoning_budget must be an integer >= 0, got {budget}")
    return budget


def completion_options(body: dict) -> Options:
    """Options of a /v1/completions body (max_tokens defaults to 16, as OpenAI's)."""
    max_tokens = _get(body, "max_tokens", int, 16)
    logprobs = _get(body, "logprobs", int)
    if logprobs is not None:
        _check_range("logprobs", logprobs, 0, MAX_COMPLETION_LOGPROBS)
    if _get(body, "echo", bool):
        raise InvalidRequest("echo is not supported")
    if _get(body, "suffix", str):
        raise InvalidRequest("suffix is not supported")
    return _options(body, max_tokens, logprobs)


def _options(body: dict, max_tokens: int | None, logprobs: int | None) -> Options:
    if _get(body, "n", int, 1) != 1:
        raise InvalidRequest("n must be 1")
    for name in ("presence_penalty", "frequency_penalty"):
        _check_range(name, _get(body, name, float, 0.0), -2.0, 2.0)
    gen = {
        "max_tokens": max_tokens, "stop": body.get("stop"), "seed": _get(body, "seed", int),
        "temperature": _get(body, "temperature", float, 1.0), "top_p": _get(body, "top_p", float, 1.0),
        "top_k": _get(body, "top_k", int, 0), "min_p": _get(body, "min_p", float, 0.0),
        "presence_penalty": _get(body, "presence_penalty", float, 0.0),
        "frequency_penalty": _get(body, "frequency_penalty", float, 0.0),
        "repetition_penalty": _get(body, "repetition_penalty", float, 1.0),
        "logit_bias": _logit_bias(body.get("logit_bias")), "logprobs": logprobs,
        "grammar": response_format(body.get("response_format")),
        # archrun's extension: the FNV-1a hash of every step's logits in the response (docs/determinism.md)
        "logit_hashes": bool(_get(body, "logit_hashes", bool, False)),
    }
    stream_options = _get(body, "stream_options", dict) or {}
    return Options(generation=gen, stream=bool(_get(body, "stream", bool)),
                   include_usage=bool(_get(stream_options, "include_usage", bool)), logprobs=logprobs,
                   cache_prompt=_get(body, "cache_prompt", bool, True))


def _get(body: dict, name: str, kind: type, default: Any = None) -> Any:
    """body[name] checked against a JSON type (null means the default)."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise InvalidRequest(f"{name} must be {_TYPE_NAMES[kind]}, got {value!r}"[:200])
    return float(value) if kind is float else value


_TYPE_NAMES = {int: "an integer", float: "a finite number", bool: "a boolean", str: "a string", dict: "an object",
               list: "an array"}


def _check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name} must lie in [{lo}, {hi}], got {value!r}")


def _logit_bias(bias: Any) -> dict[str, float]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} (ids are checked by the sampler)."""
    if bias is None:
        return {}
    if not isinstance(bias, dict) or len(bias) > 1024:
        raise InvalidRequest("logit_bias must be an object of at most 1024 token ids")
    for key in bias:
        if not key.strip().isdigit():
            raise InvalidRequest(f"logit_bias key {key!r} is not a token id"[:200])
        _check_range(f"logit_bias[{key}]", _get(bias, key, float, 0.0), -100.0, 100.0)
    return bias


def response_format(fmt: Any) -> Grammar | None:
    """The grammar of OpenAI's response_format: {"type": "text" | "json_object" | "json_schema"}.

    json_schema carries {"name", "schema", "strict"}; the output is constrained to the schema
    whatever `strict` says. An invalid schema is InvalidRequest (HTTP 400).
    """
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequest('response_format must be {"type": "text" | "json_object" | "json_schema", ...}')
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return Grammar.json_object()
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise InvalidRequest('response_format.json_schema must be {"name": ..., "schema": {...}}')
    return Grammar.json_schema(spec.get("schema", {}))


def chat_messages(body: dict) -> list[dict[str, str]]:
    """The conversation as {"role", "content"} text messages (content parts of type text are joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty array")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message: Any, i: int) -> dict[str, str]:
    if not isinstance(message, dict):
        raise InvalidRequest(f"messages[{i}] must be an object")
    role = message.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise InvalidRequest(f"messages[{i}].content parts must be {{'type': 'text', 'text': ...}} objects")
        content = "".join(p["text"] for p in content)
    elif content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise InvalidRequest(f"messages[{i}].content must be a string or an array of text parts")
    out = {"role": "system" if role == "developer" else role, "content": content}
    for name, kind in _MESSAGE_FIELDS.items():  # what chat templates render of tool calls and results
        if message.get(name) is not None:
            out[name] = _get(message, name, kind)
    return out


_MESSAGE_FIELDS = {"tool_calls": list, "tool_call_id": str, "name": str}


def chat_tools(body: dict) -> tuple[Any, Any, dict[str, Any]]:
    """(tools, tool_choice, chat_template_kwargs) of a chat body; archrun.generation.tools validates the first two.

    chat_template_kwargs (an extension) are variables for the chat template, e.g.
    {"enable_thinking": false} for Qwen3; OpenAI's reasoning_effort sets enable_thinking (false for
    "none") and the template's reasoning_effort (gpt-oss's) unless they do.
    """
    tools = _get(body, "tools", list)
    choice = body.get("tool_choice")
    kwargs = _get(body, "chat_template_kwargs", dict) or {}
    reserved = {"model", "messages", "tools", "tool_choice", "template", "add_generation_prompt", "bos_token",
                "eos_token"} & set(kwargs)
    if reserved:
        raise InvalidRequest(f"chat_template_kwargs cannot set {', '.join(sorted(reserved))}")
    effort = _get(body, "reasoning_effort", str)  # OpenAI's: "none" turns a thinking template's thinking off
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"reasoning_effort must be one of {', '.join(EFFORTS)}")
    if effort is not None and "enable_thinking" not in kwargs:
        kwargs = {**kwargs, "enable_thinking": effort != "none"}
    if effort not in (None, "none") and "reasoning_effort" not in kwargs:
        kwargs = {**kwargs, "reasoning_effort": effort}  # gpt-oss's template says it to the model
    return tools, choice, kwargs


def completion_prompt(body: dict) -> str | list[int]:
    """The prompt of a /v1/completions body: text or token ids (one prompt per request)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("prompt is empty")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise InvalidRequest("prompt must be a non-empty string or an array of token ids (one prompt per request)")


# --- responses ------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """A fresh response id, e.g. chatcmpl-3f2a..."""
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(*results: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage object of the choices of one prompt (cached_tokens: prompt tokens reused from a
    cached prefix; the prompt counts once)."""
    first, generated = results[0], sum(r.completion_tokens for r in results)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": generated,
            "total_tokens": first.prompt_tokens + generated,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


def envelope(kind: str, rid: str, model: str, fingerprint: str, created: int | None = None) -> dict[str, Any]:
    """The fields every response object and chunk carries
    (fingerprint: archrun.generation.fingerprint.system_fingerprint)."""
    return {"id": rid, "object": kind, "created": created or int(time.time()), "model": model,
            "system_fingerprint": fingerprint}


class LogprobFormatter:
    """TokenLogprobs in OpenAI's two shapes, with token strings and bytes from the tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _piece(self, token: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.token_to_piece(token)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def chat(self, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """choices[].logprobs.content of a chat completion."""
        out = []
        for e in entries:
            text, raw = self._piece(e.token)
            top = [dict(zip(("token", "bytes"), self._piece(t), strict=True), logprob=lp) for t, lp in e.top]
            out.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
        return out

    def completion(self, entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        """choices[].logprobs of a (legacy) completion; offset: characters of text before these tokens."""
        tokens, offsets = [], []
        for e in entries:
            offsets.append(offset)
            text, _ = self._piece(e.token)
            tokens.append(text)
            offset += len(text)
        top = [{self._piece(t)[0]: lp for t, lp in e.top} for e in entries]
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
                "text_offset": offsets}
