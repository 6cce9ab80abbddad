"""gpt-oss's harmony tool calls through `archrun serve`: a scripted gpt-oss reply (thinking on the analysis
channel, then a call on the commentary channel) is a tool call with reasoning in all three APIs, driven by
the official clients; the call and its result, sent back, render through a harmony chat template. The
replies are written with SmolLM2's vocabulary (no gpt-oss checkpoint is needed): the gpt-oss family's
formats read text."""

from __future__ import annotations

import json

import attrs
import pytest
from support.live_server import live_server
from support.models import real_model
from support.scripted import Scripted
from support.tool_specs import TOOLS

import archrun
from archrun.generation.tools import plan_tool_chat
from archrun.serve import anthropic as anthropic_api
from archrun.serve import responses as responses_api

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

ARGS = {"city": "Paris", "unit": "celsius"}
THOUGHT = "Need the weather."
REPLY = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary "
         f"to=functions.get_weather <|constrain|>json<|message|>{json.dumps(ARGS)}")
ASK = "What is the weather like in Paris today?"
WEATHER = TOOLS[0]["function"]
RESULT = json.dumps({"temperature_c": 18})
GREEDY = {"temperature": 0}  # the anthropic client has no sampling arguments: sent as extra fields
# a harmony chat template (after gpt-oss's): tools in the developer message, a past call in the role header,
# its result from functions.NAME; past thinking (<|channel|>analysis<|message|>) is not rendered again
TEMPLATE = (
    "{%- set ns = namespace(call=none) -%}"
    "{%- if tools -%}<|start|>developer<|message|># Tools"
    "{%- for t in tools -%}{{ '\\n' + t.function.name }}: {{ t.function.parameters|tojson }}{%- endfor -%}<|end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}{%- set ns.call = m.tool_calls[0].function -%}"
    "<|start|>assistant to=functions.{{ ns.call.name }}<|channel|>commentary json<|message|>"
    "{{ ns.call.arguments|tojson }}<|call|>"
    "{%- elif m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'tool' -%}<|start|>functions.{{ ns.call.name }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content|tojson }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
    "{#- past thinking (<|channel|>analysis<|message|>...) is not rendered again -#}")
RENDERED = (f"<|start|>user<|message|>{ASK}<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary "
            f"json<|message|>{json.dumps(ARGS)}<|call|><|start|>functions.get_weather to=assistant<|channel|>"
            f"commentary<|message|>{json.dumps(RESULT)}<|end|><|start|>assistant")


class Harmony(Scripted):
    """SmolLM2 dressed as gpt-oss: its architecture's formats, a harmony template, a scripted reply."""

    def __init__(self, model, reply: str):
        super().__init__(model, reply)
        self.descriptor = attrs.evolve(model.descriptor, architecture="gpt-oss")
        self.chat_template = TEMPLATE


@pytest.fixture(scope="module")
def gpt_oss():
    return Harmony(archrun.load(real_model("smollm2")), REPLY)


@pytest.fixture(scope="module")
def url(gpt_oss):
    with live_server(gpt_oss, parallel=1) as (base, _srv):
        yield base


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion_tool_calls_and_reasoning(url, stream):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="m", messages=[{"role": "user", "content": ASK}], tools=TOOLS, max_tokens=80, temperature=0)
    if stream:
        deltas = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True) if c.choices]
        reasoning = "".join(getattr(d.delta, "reasoning_content", None) or "" for d in deltas)
        content = "".join(d.delta.content or "" for d in deltas)
        calls = [(c.function.name, c.function.arguments) for d in deltas for c in d.delta.tool_calls or []]
        finish = deltas[-1].finish_reason
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        reasoning, content, finish = choice.message.reasoning_content, choice.message.content, choice.finish_reason
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert (reasoning, content or "", finish) == (THOUGHT, "", "tool_calls")
    assert [(name, json.loads(args)) for name, args in calls] == [("get_weather", ARGS)]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_and_thinking(url, stream):
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    kw = dict(model="m", max_tokens=80, messages=[{"role": "user", "content": ASK}], tools=tools, extra_body=GREEDY)
    if stream:
        with client.messages.stream(**kw) as s:
            r = s.get_final_message()
    else:
        r = client.messages.create(**kw)
    assert [b.type for b in r.content] == ["thinking", "tool_use"] and r.stop_reason == "tool_use"
    assert (r.content[0].thinking, r.content[1].name, r.content[1].input) == (THOUGHT, "get_weather", ARGS)
    history = [{"role": "user", "content": ASK},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.content[1].id,
                                             "content": RESULT}]}]
    again = client.messages.create(model="m", max_tokens=80, messages=history, tools=tools, extra_body=GREEDY)
    assert again.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_call_and_reasoning_items(url, stream):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="m", input=ASK, tools=[{"type": "function", **WEATHER}], max_output_tokens=80, temperature=0)
    r = list(client.responses.create(**kw, stream=True))[-1].response if stream else client.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == THOUGHT
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("get_weather", ARGS)


def test_a_forced_call_is_written_in_harmony(gpt_oss):
    """tool_choice "required": the grammar admits only the commentary channel's call (no analysis first)."""
    forced = Harmony(gpt_oss, REPLY[REPLY.index("<|channel|>commentary"):])
    with live_server(forced, parallel=1) as (base, _srv):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        choice = client.chat.completions.create(model="m", messages=[{"role": "user", "content": ASK}], tools=TOOLS,
                                                tool_choice="required", max_tokens=80, temperature=0).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [("get_weather", ARGS)]


def test_a_call_and_its_result_render_through_the_template(gpt_oss):
    """What each API makes of the call it returned and the tool's result is what the template renders."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}
    chat = [{"role": "user", "content": ASK}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    messages = anthropic_api.chat_body({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT}]},
    ]})["messages"]
    items = responses_api.chat_body({"model": "m", "input": [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": json.dumps(ARGS)},
        {"type": "function_call_output", "call_id": "call_1", "output": RESULT}]})["messages"]
    for conversation in (chat, messages, items):
        ids = plan_tool_chat(gpt_oss, conversation, TOOLS, "auto").ids
        text = gpt_oss.tokenizer.decode(ids)
        assert text.endswith(RENDERED) and "# Tools\nget_weather: " in text, text
