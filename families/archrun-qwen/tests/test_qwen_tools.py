"""Qwen's tool-call syntax: parsing (tagged, parallel, bare), streaming through the core's splitter, and the
grammar of a forced call (a Lark grammar whose outputs parse back into the call)."""

from __future__ import annotations

import json

import pytest

from archrun.errors import InvalidRequest
from archrun.generation.tools import Tool, ToolCallStream
from archrun.plugins import make_plugin_manager
from archrun_qwen import plugin
from archrun_qwen.tools import QwenToolCalls

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
REPLY = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')


def split(text: str, step: int = 3):
    stream, content, calls = ToolCallStream(QwenToolCalls()), "", []
    for i in range(0, len(text), step):
        c, new = stream.push(text[i:i + step])
        content, calls = content + c, calls + new
    c, new = stream.finish()
    return content + c, [(x.name, json.loads(x.arguments)) for x in calls + new]


def test_the_plugin_declares_the_format_for_its_architectures():
    pm = make_plugin_manager(names=["qwen"])
    for arch in ("qwen2", "qwen3", "qwen3moe"):
        assert isinstance(pm.hook.archrun_tool_call_format(architecture=arch, chat_template=None), QwenToolCalls)
    assert plugin.archrun_tool_call_format(architecture="llama", chat_template=None) is None


def test_tagged_parallel_calls_stream_out_of_the_content():
    content, calls = split(REPLY)
    assert content == "I will check."
    assert calls == [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]


def test_a_bare_call_object_and_plain_text():
    assert split('{"name": "get_weather", "arguments": {"city": "Oslo"}}') == ("", [("get_weather",
                                                                                     {"city": "Oslo"})])
    assert split("Just text, a < sign and {braces} later.") == ("Just text, a < sign and {braces} later.", [])
    assert split("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    assert split('{"a": 1}') == ('{"a": 1}', [])  # JSON that is not a call is content


def test_the_forced_call_grammar():
    g = QwenToolCalls().grammar([WEATHER])
    assert g.source == "lark"
    with pytest.raises(InvalidRequest):
        QwenToolCalls().grammar([Tool("bad", "", {"type": "nonsense"})])
