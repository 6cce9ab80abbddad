"""OpenAI's Responses API (`POST /v1/responses`, stateless) over the chat machinery.

A request is validated and translated into the chat-completions body the server already serves
(`instructions` as the system message, `input` as text or message / function_call /
function_call_output items, function `tools`, `text.format` as response_format); the reply's Parts
come back as output items (reasoning, message with output_text, function_call), whole or as the
stream events response.created ... response.completed. Nothing is stored: `previous_response_id`
is refused. Errors take OpenAI's shape.
"""

from __future__ import annotations

import json
import time
from typing import Any

from archrun.errors import InvalidRequest
from archrun.generation.generate import GenerationResult
from archrun.serve import protocol
from archrun.serve.reply import Blocks, Part, ReplyParts
from archrun.text.reasoning import EFFORTS

INPUT_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
ECHOED = ("instructions", "max_output_tokens", "temperature", "top_p", "metadata")


# --- requests -------------------------------------------------------------------------------


def chat_body(body: dict) -> dict[str, Any]:
    """The chat-completions body of a Responses request (InvalidRequest for a bad one)."""
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise InvalidRequest(f"{name} is not supported: this server stores no responses (send the whole input)")
    if body.get("background"):
        raise InvalidRequest("background responses are not supported")
    messages = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise InvalidRequest("instructions must be a string")
        messages.append({"role": "system", "content": body["instructions"]})
    messages += _input(body.get("input"))
    chat: dict[str, Any] = {"messages": messages, "stream": body.get("stream", False)}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "seed", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
        chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    elif body.get("tool_choice") not in (None, "none", "auto"):
        raise InvalidRequest("tool_choice needs tools")
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    if reasoning.get("effort") is not None:
        effort = reasoning["effort"]
        if effort not in EFFORTS:
            raise InvalidRequest(f"reasoning.effort must be one of {', '.join(EFFORTS)}")
        chat["chat_template_kwargs"] = {"enable_thinking": effort != "none",
                                        **({"reasoning_effort": effort} if effort != "none" else {})}
    if reasoning.get("max_tokens") is not None:  # OpenRouter's reasoning budget: the thinking is cut there
        chat["reasoning"] = {"max_tokens": reasoning["max_tokens"]}
    return chat


def _input(items: Any) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise InvalidRequest("input must be a string or a non-empty array of items")
    out: list[dict] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, i))
        elif kind == "function_call":
            call = _call(item, i)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequest(f"input[{i}].call_id must be a string")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _content(item.get("output"), f"input[{i}].output")})
        elif kind != "reasoning":  # past reasoning is not shown to the model again
            raise InvalidRequest(f"input[{i}]: unsupported item type {kind!r}"[:200])
    return out


def _message(item: dict, i: int) -> dict:
    role = item.get("role")
    if role not in INPUT_ROLES:
        raise InvalidRequest(f"input[{i}].role must be one of {', '.join(INPUT_ROLES)}")
    return {"role": "system" if role == "developer" else role,
            "content": _content(item.get("content"), f"input[{i}].content")}


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{where}[{j}]: only text parts are supported, got {kind!r}"[:200])
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"{where} must be a string or an array of text parts")


def _call(item: dict, i: int) -> dict:
    if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        raise InvalidRequest(f"input[{i}]: a function_call item needs call_id, name and arguments (strings)")
    fn = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": fn}


def _tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(f"tools[{i}]: only function tools are served, got {kind!r}"[:200])
        fn = {"name": tool.get("name"), "description": tool.get("description") or ""}
        if tool.get("parameters") is not None:
            fn["parameters"] = tool["parameters"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}')


def _text_format(text: Any) -> dict | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequest('text.format must be {"type": "text" | "json_object" | "json_schema", ...}')
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    if not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest('text.format json_schema needs "schema" (an object)')
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "output"), "schema": fmt["schema"],
                                                   "strict": fmt.get("strict")}}


# --- responses ------------------------------------------------------------------------------


def head(body: dict, model: str) -> dict[str, Any]:
    """The response object's fields that do not depend on the reply."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {"id": protocol.new_id("resp"), "object": "response", "created_at": int(time.time()), "model": model,
            "error": None, "incomplete_details": None, "output": [], "parallel_tool_calls": True,
            "previous_response_id": None, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "text": {"format": text.get("format") or {"type": "text"}},
            "reasoning": {"effort": None, "summary": None}, "store": False,
            **{k: body.get(k) for k in ECHOED}, "metadata": body.get("metadata") or {}}


def item(part: Part, item_id: str, done: bool = True) -> dict[str, Any]:
    """The output item of a Part (done False: as announced when it starts, without its text)."""
    status = "completed" if done else "in_progress"
    if part.kind == "reasoning":
        content = [{"type": "reasoning_text", "text": part.text}] if done else []
        return {"type": "reasoning", "id": item_id, "summary": [], "content": content}
    if part.kind == "text":
        content = [output_text(part.text)] if done else []
        return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}
    return {"type": "function_call", "id": item_id, "call_id": part.call.id, "name": part.call.name,
            "arguments": part.call.arguments if done else "", "status": status}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def item_id(part: Part) -> str:
    return protocol.new_id({"reasoning": "rs", "text": "msg", "tool": "fc"}[part.kind])


def finished(head: dict, output: list[dict], result: GenerationResult, reasoning_tokens: int) -> dict[str, Any]:
    """The whole response object."""
    cut = result.finish_reason == "length" and not any(o["type"] == "function_call" for o in output)
    return {**head, "status": "incomplete" if cut else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "usage": {"input_tokens": result.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": result.cached_tokens},
                      "output_tokens": result.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                      "total_tokens": result.prompt_tokens + result.completion_tokens}}


class ResponseEvents:
    """The stream of one response: response.created, response.in_progress, per output item
    output_item.added, its deltas and .done events, output_item.done; then response.completed (or
    response.incomplete). `count(text)` gives the tokens of reasoning text (usage)."""

    def __init__(self, head: dict, parts: ReplyParts, count: Any):
        self.head, self.parts, self.count = head, parts, count
        self.blocks = Blocks()
        self.ids: list[str] = []
        self.seq = 0

    def _sse(self, kind: str, **data: Any) -> str:
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.seq - 1, **data})}\n\n"

    def open(self) -> list[str]:
        start = {**self.head, "status": "in_progress"}
        return [self._sse("response.created", response=start), self._sse("response.in_progress", response=start)]

    def piece(self, text: str, logprobs: Any) -> list[str]:
        return self._events(self.blocks.feed(self.parts.push(text)))

    def finish(self, result: GenerationResult) -> list[str]:
        out = self._events(self.blocks.feed(self.parts.finish()) + self.blocks.close())
        output = [item(b, i) for b, i in zip(self.blocks.blocks, self.ids, strict=True)]
        reasoning = "".join(b.text for b in self.blocks.blocks if b.kind == "reasoning")
        whole = finished(self.head, output, result, self.count(reasoning) if reasoning else 0)
        kind = "response.completed" if whole["status"] == "completed" else "response.incomplete"
        return [*out, self._sse(kind, response=whole)]

    def fail(self, status: int, text: str) -> list[str]:
        return [self._sse("error", code=str(status), message=text, param=None)]

    def close(self, results: list) -> list[str]:
        return []

    def _events(self, happened: list[tuple]) -> list[str]:
        out = []
        for what, i, *text in happened:
            part = self.blocks.blocks[i]
            if what == "start":
                self.ids.append(item_id(part))
                out.append(self._sse("response.output_item.added", output_index=i, item=item(part, self.ids[i], False)))
                if part.kind == "text":
                    out.append(self._sse("response.content_part.added", item_id=self.ids[i], output_index=i,
                                         content_index=0, part=output_text("")))
            elif what == "delta":
                out.append(self._delta(part.kind, i, text[0]))
            else:
                out += self._done(part, i)
        return out

    def _delta(self, kind: str, i: int, text: str) -> str:
        name = {"reasoning": "response.reasoning_text.delta", "text": "response.output_text.delta",
                "tool": "response.function_call_arguments.delta"}[kind]
        extra = {"content_index": 0} if kind != "tool" else {}
        extra = {**extra, "logprobs": []} if kind == "text" else extra
        return self._sse(name, item_id=self.ids[i], output_index=i, delta=text, **extra)

    def _done(self, part: Part, i: int) -> list[str]:
        at = {"item_id": self.ids[i], "output_index": i}
        if part.kind == "reasoning":
            out = [self._sse("response.reasoning_text.done", **at, content_index=0, text=part.text)]
        elif part.kind == "text":
            out = [self._sse("response.output_text.done", **at, content_index=0, text=part.text, logprobs=[]),
                   self._sse("response.content_part.done", **at, content_index=0, part=output_text(part.text))]
        else:
            out = [self._sse("response.function_call_arguments.done", **at, name=part.call.name,
                             arguments=part.call.arguments)]
        return [*out, self._sse("response.output_item.done", output_index=i, item=item(part, self.ids[i]))]
