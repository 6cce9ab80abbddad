"""GLM-4.5's tool-call syntax (its chat template): a call is the function name after <tool_call>, then one
<arg_key>/<arg_value> pair per argument (string values as they are, other values as JSON), then
</tool_call>; several calls follow one another."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from archrun.generation.grammar import Grammar
from archrun.generation.tools import Tool, ToolCallFormat

_CALL = re.compile(r"<tool_call>\s*([^\s<]+)\s*(.*?)</tool_call>", re.DOTALL)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm45ToolCalls(ToolCallFormat):
    """<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>"""

    name = "glm45-xml"
    triggers = ("<tool_call>",)

    def parse(self, section: str, final: bool) -> list[tuple[str, Any]]:
        return [(name, {k.strip(): _value(v) for k, v in _ARG.findall(body)}) for name, body in _CALL.findall(section)]

    def grammar(self, tools: Sequence[Tool]) -> Grammar:
        """One call to one of `tools`: its properties in their declared order, the required ones present."""
        rules = [f"start: {' | '.join(f'call{i}' for i in range(len(tools)))}"]
        for i, tool in enumerate(tools):
            props = tool.parameters.get("properties", {})
            required = set(tool.parameters.get("required", ()))
            args = []
            for j, (key, schema) in enumerate(props.items()):
                rules.append(f"arg{i}_{j}: {json.dumps(f'<arg_key>{key}</arg_key>')} \"\\n<arg_value>\" "
                             f"{_value_rule(schema)} \"</arg_value>\\n\"")
                args.append(f"arg{i}_{j}" + ("" if key in required else "?"))
            rules.append(f"call{i}: {json.dumps('<tool_call>' + tool.name)} \"\\n\" {' '.join(args)} \"</tool_call>\"")
        rules.append(r'TEXT: /[^<]{0,256}/')
        return Grammar.lark("\n".join(rules))

    def describe(self, tools: Sequence[Tool]) -> str:
        listing = "\n".join(json.dumps(t.to_openai()["function"], ensure_ascii=False) for t in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                f"with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n</tools>\n\n"
                "For each function call, output the function name and arguments within the following XML format:"
                "\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>"
                "\n...\n</tool_call>")


def _value(text: str) -> Any:
    """An argument value: the JSON value it spells, else the text itself (the template writes strings raw)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _value_rule(schema: Any) -> str:
    """A string argument is raw text (no '<'); any other is JSON valid under its schema."""
    if isinstance(schema, dict) and schema.get("type") == "string" and set(schema) <= {"type", "description"}:
        return "TEXT"
    return f"%json{json.dumps(schema if isinstance(schema, dict) else {})}"
