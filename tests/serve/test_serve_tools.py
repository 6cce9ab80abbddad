"""Tool calls through `archrun serve`, driven by the openai client on two families with different formats:
Qwen2.5 (qwen2: `<tool_call>` JSON, tools rendered by the file's template) and SmolLM2 (llama: a bare JSON
reply, tools offered in a system message), tool_choice auto / required / named, streamed and not."""

from __future__ import annotations

import json

import jsonschema
import pytest
from support.live_server import live_server
from support.models import real_model
from support.scripted import Scripted
from support.tool_specs import TOOLS

import archrun

openai = pytest.importorskip("openai")

ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMED = {"type": "function", "function": {"name": "add"}}


def _client(name: str):
    model = archrun.load(real_model(name))
    with live_server(model, parallel=2) as (url, _srv):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def qwen():
    yield from _client("qwen25")


@pytest.fixture(scope="module")
def smol():
    yield from _client("smollm2")


def ask(client, choice, stream: bool, messages=ASK, max_tokens=60):
    """(content, [(name, arguments dict)], finish_reason) of one request."""
    kw = dict(model="m", messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens,
              temperature=0, stream=stream)
    if not stream:
        r = client.chat.completions.create(**kw).choices[0]
        calls = r.message.tool_calls or []
        return r.message.content, [(c.function.name, json.loads(c.function.arguments)) for c in calls], r.finish_reason
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            entry = calls.setdefault(c.index, {"name": "", "arguments": "", "id": c.id})
            entry["name"] += c.function.name or ""
            entry["arguments"] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content or None, [(c["name"], json.loads(c["arguments"])) for c in calls.values()], finish


def valid(calls, name=None):
    assert len(calls) == 1
    called, args = calls[0]
    assert called in SCHEMAS and (name is None or called == name)
    jsonschema.validate(args, SCHEMAS[called])
    return called, args


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["auto", "required", NAMED])
def test_qwen(qwen, choice, stream):
    content, calls, finish = ask(qwen, choice, stream)
    name, args = valid(calls, "add" if choice == NAMED else None)
    assert finish == "tool_calls" and not content
    if choice != NAMED:  # the model's own choice (auto) or a forced one it steers
        assert name == "get_weather" and args["city"] == "Paris"


def test_qwen_answers_from_a_tool_result(qwen):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature_c": 31, "sky": "clear"})}]
    content, calls, finish = ask(qwen, "none", False, history, max_tokens=40)
    assert not calls and finish in ("stop", "length") and "31" in content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_smollm2_forced(smol, choice, stream):
    content, calls, finish = ask(smol, choice, stream)
    valid(calls, "add" if choice == NAMED else None)
    assert finish == "tool_calls" and not content


@pytest.mark.parametrize("stream", [False, True])
def test_smollm2_auto_answers_in_text(smol, stream):
    content, calls, finish = ask(smol, "auto", stream, max_tokens=16)
    assert content and not calls and finish in ("stop", "length")


def test_bad_tool_requests_are_400(smol):
    for kw in (dict(tools=[{"type": "function", "function": {"name": "x y"}}]),
               dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
               dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
               dict(extra_body={"chat_template_kwargs": {"messages": []}})):
        with pytest.raises(openai.BadRequestError):
            smol.chat.completions.create(model="m", messages=ASK, max_tokens=4, **kw)




@pytest.fixture(scope="module")
def smol_model():
    return archrun.load(real_model("smollm2"))


@pytest.mark.parametrize("stream", [False, True])
def test_llama_format_in_auto_mode(smol_model, stream):
    model = smol_model
    call = {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}
    with live_server(Scripted(model, " " + json.dumps(call)), parallel=1) as (url, _srv):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        content, calls, finish = ask(client, "auto", stream, max_tokens=60)
    assert valid(calls) == ("get_weather", call["parameters"]) and finish == "tool_calls" and not content
    with live_server(Scripted(model, "It is sunny in Paris."), parallel=1) as (url, _srv):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert ask(client, "auto", stream, max_tokens=60) == ("It is sunny in Paris.", [], "stop")
