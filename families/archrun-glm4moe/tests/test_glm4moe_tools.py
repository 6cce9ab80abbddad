"""GLM-4.5's XML-style tool calls: parsing, streaming through the core's splitter, and forced calls on the tiny
glm4moe fixture (random weights: the grammar alone makes its reply a call that parses and fits the schema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import archrun
from archrun.generation.tools import ToolCallStream
from archrun_glm4moe import plugin
from archrun_glm4moe.tools import Glm45ToolCalls

FIXTURE = Path(__file__).parent / "goldens" / "glm4moe_base.gguf"
# the fixture's context is 256 byte-level tokens: a template that names the tools briefly
TEMPLATE = ("{% if tools %}<|system|>\ntools:{% for t in tools %} {{ t.function.name }}{% endfor %}{% endif %}"
            "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
REPLY = ("Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")


def test_the_plugin_declares_the_format():
    assert isinstance(plugin.archrun_tool_call_format(architecture="glm4moe", chat_template=None), Glm45ToolCalls)


def test_parse_and_stream():
    stream, content, calls = ToolCallStream(Glm45ToolCalls()), "", []
    for i in range(0, len(REPLY), 5):
        c, new = stream.push(REPLY[i:i + 5])
        content, calls = content + c, calls + new
    c, new = stream.finish()
    content, calls = content + c, calls + new
    assert content == "Let me look." and [(x.name, json.loads(x.arguments)) for x in calls] == \
        [("get_weather", {"city": "Oslo", "days": 3})]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_forced_call_on_random_weights_parses_and_validates(seed):
    model = archrun.load(FIXTURE, backend="reference")
    gen = archrun.chat(model, [{"role": "user", "content": "weather?"}], template=TEMPLATE, tools=[WEATHER],
                       tool_choice="required", max_tokens=180, temperature=1.0, seed=seed)
    assert "".join(gen) == ""
    r = gen.result
    assert r.finish_reason == "stop" and len(r.tool_calls) == 1 and r.tool_calls[0].name == "get_weather"
    jsonschema.validate(json.loads(r.tool_calls[0].arguments), WEATHER["function"]["parameters"])
