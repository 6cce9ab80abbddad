"""Llama 3.1+'s JSON tool calls (its chat template's "JSON based tool calling"): the whole reply is
one JSON object {"name": ..., "parameters": {...}}, optionally after <|python_tag|>."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from archrun.generation.grammar import Grammar
from archrun.generation.tools import Tool, ToolCallFormat, arguments_schema

_TAG = "<|python_tag|>"


class Llama3ToolCalls(ToolCallFormat):
    """{"name": NAME, "parameters": {...}} as the whole reply."""

    name = "llama3-json"
    triggers = (_TAG,)

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith("{"):
            return len(text) - len(stripped)
        return super().start(text)

    def hold(self, text: str) -> int:
        if not text.strip():  # a reply that may still open with "{"
            return len(text)
        return super().hold(text)

    def parse(self, section: str, final: bool) -> list[tuple[str, Any]]:
        body = section.removeprefix(_TAG).strip() if section.lstrip().startswith(_TAG) else section.strip()
        try:
            call, _ = json.JSONDecoder().raw_decode(body)  # text after the object is ignored
        except ValueError:
            if final:
                raise
            return []  # the object is not complete yet
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError('a tool call is {"name": ..., "parameters": {...}}')
        return [(call["name"], call.get("parameters", call.get("arguments", {})))]

    def grammar(self, tools: Sequence[Tool]) -> Grammar:
        return Grammar.json_schema({"anyOf": [arguments_schema(t, args_key="parameters") for t in tools]})

    def describe(self, tools: Sequence[Tool]) -> str:
        listing = "\n\n".join(json.dumps(t.to_openai()) for t in tools)
        return ("You have access to the following functions. To call a function, respond with JSON for a "
                "function call only, in the format {\"name\": function name, \"parameters\": dictionary of "
                f"argument name and its value}}. Do not use variables.\n\n{listing}")
