"""gpt-oss's tool calls in OpenAI's harmony format.

A call is a message to a recipient on the commentary channel; the recipient (`functions.NAME` for
the functions a request offers) is written after the channel or in the role header, the content
type (`json`) after an optional `<|constrain|>`, then the arguments and `<|call|>`:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{...}<|call|>

(the second is how gpt-oss's chat template writes past calls back). `<|call|>` ends generation, so
the last call of a reply usually ends with the text. After the analysis channel's `<|end|><|start|>
assistant` (which the HARMONY reasoning format closes on) the answer starts with `to=` or with the
commentary channel's header. Tool results are rendered by the template (`<|start|>functions.NAME
to=assistant<|channel|>commentary<|message|>...`) from OpenAI's tool messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from archrun.generation.grammar import Grammar
from archrun.generation.tools import Tool, ToolCallFormat

_RECIPIENT = r"to=(?P<{}>[^\s<]+)"
_HEADER = re.compile(
    r"(?:<\|start\|>assistant)?\s*(?:" + _RECIPIENT.format("before") + r"\s*)?<\|channel\|>commentary"
    r"(?:\s+" + _RECIPIENT.format("after") + r")?\s*(?:<\|constrain\|>)?\s*(?P<type>[\w/.+-]*)\s*<\|message\|>")
_ENDS = ("<|call|>", "<|end|>", "<|return|>")
FUNCTIONS = "functions."


class HarmonyToolCalls(ToolCallFormat):
    """Calls on harmony's commentary channel to `functions.NAME`, arguments as JSON."""

    name = "harmony"
    triggers = ("<|channel|>commentary to=", "<|start|>assistant to=")

    def start(self, text: str) -> int | None:
        head = text.lstrip()
        if head.startswith("to="):  # the recipient in the role header, right after the analysis closed
            return len(text) - len(head)
        return super().start(text)

    def hold(self, text: str) -> int:
        head = text.lstrip()
        if not head or "to=".startswith(head):
            return len(text)
        return super().hold(text)

    def parse(self, section: str, final: bool) -> list[tuple[str, Any]]:
        calls, at = [], 0
        while (header := _HEADER.search(section, at)) is not None:
            recipient = header["before"] or header["after"]
            ends = [i for e in _ENDS if (i := section.find(e, header.end())) >= 0]
            if not ends and not final:
                break  # the arguments are still being written
            stop = min(ends) if ends else len(section)
            if recipient is not None:  # a commentary message to no one is a preamble, not a call
                calls.append((recipient.removeprefix(FUNCTIONS), json.loads(section[header.end():stop])))
            at = stop
        return calls

    def grammar(self, tools: Sequence[Tool]) -> Grammar:
        """One call to one of `tools` on the commentary channel. The markup is text: gpt-oss's vocabulary
        has `<|channel|>`, `<|constrain|>` and `<|message|>` as user-defined tokens (archrun.text.tokenizer, as
        llama.cpp renders them), so each is one token the grammar admits as its text."""
        rules = [f"start: {' | '.join(f'call{i}' for i in range(len(tools)))}"]
        for i, tool in enumerate(tools):
            head = f"<|channel|>commentary to={FUNCTIONS}{tool.name} <|constrain|>json<|message|>"
            rules.append(f"call{i}: {json.dumps(head)} %json{json.dumps(_strict(tool.parameters))}")
        return Grammar.lark("\n".join(rules))

    def describe(self, tools: Sequence[Tool]) -> str:
        """The developer message's tools section when a template does not render `tools` (gpt-oss's
        does): each function's JSON Schema in the `functions` namespace."""
        listing = "\n\n".join(f"// {t.description}\n{t.name}: {json.dumps(t.parameters, ensure_ascii=False)}"
                              for t in tools)
        return ("# Tools\n\n## functions\n\nnamespace functions {\n\n" + listing + "\n\n} // namespace functions\n\n"
                "Calls to these tools must go to the commentary channel: 'functions'.")


def _strict(params: dict) -> dict:
    """A forced call's arguments: only the properties the tool names, unless its schema says otherwise."""
    return {"additionalProperties": False, **params} if "properties" in params else params
