"""Qwen's tool-call syntax (Qwen2.5 / Qwen3 chat templates, the "Hermes" style): each call is a JSON
object {"name": ..., "arguments": {...}} between <tool_call> and </tool_call> lines; several calls
follow one another."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from archrun.generation.grammar import Grammar
from archrun.generation.tools import Tool, ToolCallFormat, arguments_schema

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class QwenToolCalls(ToolCallFormat):
    """<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>, repeated for parallel calls.

    Small Qwen models sometimes drop the tags and answer with the bare object: a reply that opens
    with {"name": ..., "arguments": ...} is read as one call too.
    """

    name = "qwen"
    triggers = ("<tool_call>",)

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith("{"):
            return len(text) - len(stripped)
        return super().start(text)

    def hold(self, text: str) -> int:
        return len(text) if not text.strip() else super().hold(text)

    def parse(self, section: str, final: bool) -> list[tuple[str, Any]]:
        if section.startswith("{"):
            try:
                return [_call(json.JSONDecoder().raw_decode(section)[0])]
            except ValueError:
                if final:
                    raise
                return []  # not complete yet
        return [_call(json.loads(body)) for body in _CALL.findall(section)]

    def grammar(self, tools: Sequence[Tool]) -> Grammar:
        schema = {"anyOf": [arguments_schema(t) for t in tools]}
        return Grammar.lark(f'start: "<tool_call>\\n" %json{json.dumps(schema)} "\\n</tool_call>"')

    def describe(self, tools: Sequence[Tool]) -> str:
        listing = "\n".join(json.dumps(t.to_openai()) for t in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                f"with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")


def _call(call: Any) -> tuple[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        raise ValueError('a tool call is {"name": ..., "arguments": {...}}')
    return call["name"], call["arguments"]
