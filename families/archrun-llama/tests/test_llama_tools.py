"""Llama 3's JSON tool calls: parsing (with and without <|python_tag|>), streaming through the core's
splitter (a reply that opens with "{" is held back until it is known to be a call), forced-call grammar."""

from __future__ import annotations

import json

from archrun.generation.tools import Tool, ToolCallStream
from archrun.plugins import make_plugin_manager
from archrun_llama import plugin
from archrun_llama.tools import Llama3ToolCalls


def split(text: str, step: int = 4):
    stream, content, calls = ToolCallStream(Llama3ToolCalls()), "", []
    for i in range(0, len(text), step):
        c, new = stream.push(text[i:i + step])
        content, calls = content + c, calls + new
    c, new = stream.finish()
    return content + c, [(x.name, json.loads(x.arguments)) for x in calls + new]


def test_the_plugin_declares_the_format():
    pm = make_plugin_manager(names=["llama"])
    assert isinstance(pm.hook.archrun_tool_call_format(architecture="llama", chat_template=None), Llama3ToolCalls)
    assert plugin.archrun_tool_call_format(architecture="qwen2", chat_template=None) is None


def test_calls_and_text():
    call = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    assert split("  " + call) == ("", [("add", {"a": 1, "b": 2})])
    assert split("<|python_tag|>" + call) == ("", [("add", {"a": 1, "b": 2})])
    assert split("The sum is 3.") == ("The sum is 3.", [])
    assert split('{"unfinished": ') == ('{"unfinished": ', [])


def test_the_forced_call_grammar_is_a_json_schema_of_name_and_parameters():
    g = Llama3ToolCalls().grammar([Tool("add", "", {"type": "object", "properties": {"a": {"type": "integer"}}})])
    assert g.source == "json_schema"
