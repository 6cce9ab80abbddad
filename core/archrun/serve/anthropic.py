"""Anthropic's Messages API (`POST /v1/messages`) over the chat machinery.

A request is validated and translated into the chat-completions body the server already serves
(system prompt first, `tool_result` blocks as tool messages, `tool_use` blocks as tool calls,
`tools`/`tool_choice` in OpenAI's shape, `thinking` as the template's `enable_thinking`); the reply's
Parts come back as Anthropic content blocks (thinking, text, tool_use), whole or as the stream
events message_start ... message_stop. Errors take Anthropic's shape:
{"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse

from archrun.errors import InvalidRequest
from archrun.generation.generate import GenerationResult
from archrun.serve.reply import Blocks, Part, ReplyParts

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 499: "invalid_request_error",
               503: "overloaded_error", 507: "overloaded_error", 529: "overloaded_error"}
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
MAX_STOP_SEQUENCES = 16


def error_response(status: int, message: str) -> JSONResponse:
    """An error in Anthropic's shape."""
    kind = ERROR_TYPES.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


# --- requests -------------------------------------------------------------------------------


def chat_body(body: dict) -> dict[str, Any]:
    """The chat-completions body of a Messages request (InvalidRequest for a bad one)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: a model name (string) is required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest("max_tokens: an integer >= 1 is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: a non-empty array is required")
    out = _system(body.get("system"))
    for i, message in enumerate(messages):
        out += _message(message, i)
    chat = {"messages": out, "max_tokens": max_tokens, "stream": _flag(body, "stream"),
            "stop": _stops(body.get("stop_sequences")), "chat_template_kwargs": _thinking(body.get("thinking"))}
    if isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled":
        chat["reasoning_budget"] = body["thinking"]["budget_tokens"]  # the thinking is cut there
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and \
            not (math.isfinite(temperature) and 0 <= temperature <= 1):
        raise InvalidRequest(f"temperature: must lie in [0, 1], got {temperature!r}")
    fmt = _output_format(body.get("output_config"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
        chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    elif body.get("tool_choice") is not None:
        raise InvalidRequest("tool_choice: needs tools")
    return chat


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: must be a boolean")
    return value


def _text(value: Any, where: str) -> str:
    """A string, or an array of text blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(_is_text(b) for b in value):
        return "".join(b["text"] for b in value)
    raise InvalidRequest(f"{where}: must be a string or an array of text blocks")


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


def _system(system: Any) -> list[dict]:
    if system is None:
        return []
    return [{"role": "system", "content": _text(system, "system")}]


def _message(message: Any, i: int) -> list[dict]:
    where = f"messages.{i}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise InvalidRequest(f'{where}: must be an object with role "user" or "assistant"')
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or an array of content blocks")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content.{j}"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # past thinking is not shown to the model again (as the templates do)
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at))
        else:
            raise InvalidRequest(f"{at}: unsupported content block {kind!r} in a {role} message"[:200])
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tool_use(block: dict, at: str) -> dict:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or \
            not isinstance(block.get("input"), dict):
        raise InvalidRequest(f"{at}: a tool_use block needs id, name and an input object")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"])}}


def _tool_result(block: dict, at: str) -> dict:
    if not isinstance(block.get("tool_use_id"), str):
        raise InvalidRequest(f"{at}: a tool_result block needs tool_use_id")
    content = block.get("content", "")
    text = _text(content, f"{at}.content")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _stops(stops: Any) -> list[str] | None:
    if stops is None:
        return None
    if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES or \
            not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequest(f"stop_sequences: must be an array of at most {MAX_STOP_SEQUENCES} non-empty strings")
    return stops or None


def _thinking(thinking: Any) -> dict[str, Any]:
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise InvalidRequest('thinking: must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}')
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise InvalidRequest("thinking.budget_tokens: an integer >= 1 is required when thinking is enabled")
    return {"enable_thinking": kind != "disabled"}


def _output_format(config: Any) -> dict | None:
    """output_config.format ({"type": "json_schema", "schema": {...}}) as a response_format."""
    if config is None:
        return None
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest('output_config.format: must be {"type": "json_schema", "schema": {...}}')
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(f"tools.{i}: only custom tools (name, input_schema) are served, got {kind!r}"[:200])
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(f"tools.{i}.input_schema: an object (JSON Schema) is required")
        out.append({"type": "function", "function": {"name": tool.get("name"), "parameters": schema,
                                                     "description": tool.get("description", "")}})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise InvalidRequest('tool_choice: {"type": "tool"} needs a name')
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind not in TOOL_CHOICES:
        raise InvalidRequest('tool_choice: type must be "auto", "any", "tool" or "none"')
    return TOOL_CHOICES[kind]


# --- responses ------------------------------------------------------------------------------


def stop_reason(result: GenerationResult, stop: str | None, calls: bool) -> str:
    """Anthropic's stop_reason of a finished reply."""
    if calls:
        return "tool_use"
    if stop is not None:
        return "stop_sequence"
    return "max_tokens" if result.finish_reason == "length" else "end_turn"


def usage(result: GenerationResult) -> dict[str, int]:
    """Anthropic's usage: input_tokens are the prompt tokens computed (cache reads counted apart)."""
    return {"input_tokens": result.prompt_tokens - result.cached_tokens, "output_tokens": result.completion_tokens,
            "cache_read_input_tokens": result.cached_tokens, "cache_creation_input_tokens": 0}


def block(part: Part) -> dict[str, Any]:
    """The content block of a whole Part."""
    if part.kind == "reasoning":
        return {"type": "thinking", "thinking": part.text, "signature": ""}
    if part.kind == "text":
        return {"type": "text", "text": part.text}
    call = part.call
    return {"type": "tool_use", "id": tool_id(call.id), "name": call.name, "input": _input(call.arguments)}


def tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def message(head: dict, blocks: list[Part], result: GenerationResult, stop: str | None) -> dict[str, Any]:
    """The whole message object (head: id and model)."""
    content = [block(b) for b in blocks] or [{"type": "text", "text": ""}]
    calls = any(b.kind == "tool" for b in blocks)
    return {**head, "type": "message", "role": "assistant", "content": content,
            "stop_reason": stop_reason(result, stop, calls), "stop_sequence": stop, "usage": usage(result)}


def sse(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


class MessageEvents:
    """The stream of one message: message_start, content blocks (start, deltas, stop), message_delta,
    message_stop. `stop_of(result)` gives the stop string that ended a result (or None)."""

    def __init__(self, head: dict, parts: ReplyParts, prompt_tokens: int, stop_of: Any):
        self.head, self.parts, self.stop_of = head, parts, stop_of
        self.blocks = Blocks()
        self.prompt_tokens = prompt_tokens

    def open(self) -> list[str]:
        start = {**self.head, "type": "message", "role": "assistant", "content": [], "stop_reason": None,
                 "stop_sequence": None, "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return [sse("message_start", {"message": start})]

    def piece(self, text: str, logprobs: Any) -> list[str]:
        return self._events(self.blocks.feed(self.parts.push(text)))

    def finish(self, result: GenerationResult) -> list[str]:
        out = self._events(self.blocks.feed(self.parts.finish()) + self.blocks.close())
        if not self.blocks.blocks:  # an empty reply is one empty text block
            out += self._events([("start", 0), ("stop", 0)], empty=True)
        stop = self.stop_of(result)
        reason = stop_reason(result, stop, any(b.kind == "tool" for b in self.blocks.blocks))
        return [*out, sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": stop},
                                            "usage": usage(result)}),
                sse("message_stop", {})]

    def fail(self, status: int, text: str) -> list[str]:
        return [sse("error", {"error": {"type": ERROR_TYPES.get(status, "api_error"), "message": text}})]

    def close(self, results: list) -> list[str]:
        return []

    def _events(self, happened: list[tuple], empty: bool = False) -> list[str]:
        out = []
        for what, i, *text in happened:
            part = Part("text") if empty else self.blocks.blocks[i]
            if what == "start":
                first = block(part) if part.kind != "tool" else {**block(part), "input": {}}
                first = {**first, "text": ""} if part.kind == "text" else first
                first = {**first, "thinking": ""} if part.kind == "reasoning" else first
                out.append(sse("content_block_start", {"index": i, "content_block": first}))
            elif what == "delta":
                delta = {"reasoning": {"type": "thinking_delta", "thinking": text[0]},
                         "text": {"type": "text_delta", "text": text[0]},
                         "tool": {"type": "input_json_delta", "partial_json": text[0]}}[part.kind]
                out.append(sse("content_block_delta", {"index": i, "delta": delta}))
            else:
                out.append(sse("content_block_stop", {"index": i}))
        return out
