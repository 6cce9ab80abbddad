"""Anthropic's Messages API and OpenAI's Responses API on `archrun serve`, driven by the official
`anthropic` and `openai` clients against the real SmolLM2 model (greedy answers equal the chat
completion of the same conversation), and reasoning split from the answer in all three APIs
(a scripted thinking reply, and SmolLM2 with a template that opens the thinking)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from support.live_server import live_server
from support.models import real_model
from support.scripted import Scripted
from support.tool_specs import TOOLS

import archrun

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

ASK = [{"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0}  # the anthropic client has no sampling arguments: sent as extra fields
WEATHER = TOOLS[0]["function"]
ANTHROPIC_TOOLS = [{"name": WEATHER["name"], "description": WEATHER["description"],
                    "input_schema": WEATHER["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", **WEATHER}]
SCHEMA = {"type": "object", "properties": {"colour": {"type": "string"}, "hex": {"type": "string"}},
          "required": ["colour", "hex"], "additionalProperties": False}
# SmolLM2's template with a generation prompt that opens the thinking (as DeepSeek-R1's does), closed at
# once when enable_thinking is false (as Qwen3's does)
OPEN = "{{ '<|im_start|>assistant\n' }}"
THINKING = ("{{ '<|im_start|>assistant\n<think>\n' }}{% if enable_thinking is defined and not enable_thinking %}"
            "{{ '\n</think>\n\n' }}{% endif %}")


@pytest.fixture(scope="module")
def model():
    return archrun.load(real_model("smollm2"))


@pytest.fixture(scope="module")
def server(model):
    with live_server(model, parallel=2) as (url, srv):
        yield url, srv


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server[0], api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_text(oai, messages, max_tokens=12, **kw) -> tuple[str, str]:
    r = oai.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0, **kw)
    return r.choices[0].message.content, r.choices[0].finish_reason


# --- Messages ---


def test_messages_equal_the_chat_completion(claude, oai):
    text, finish = chat_text(oai, [{"role": "system", "content": "Answer briefly."}, *ASK])
    r = claude.messages.create(model="smollm2", max_tokens=12, extra_body=GREEDY, system="Answer briefly.",
                               messages=ASK)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == text
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[finish] and r.stop_sequence is None
    assert r.usage.output_tokens <= 12 and r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 5


def test_messages_stream_equals_the_whole_message(claude):
    kw = dict(model="smollm2", max_tokens=10, extra_body=GREEDY, messages=[{"role": "user", "content": "Say hi."}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(events)
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_messages_stop_sequence(claude):
    kw = dict(model="smollm2", max_tokens=40, extra_body=GREEDY,
              messages=[{"role": "user", "content": "Count: 1, 2, 3"}])
    free = claude.messages.create(**kw).content[0].text
    stop = free.strip()[2:4]  # a piece of the free answer, which must then end it
    r = claude.messages.create(**kw, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop and stop not in r.content[0].text
    with claude.messages.stream(**kw, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", stop, r.content[0].text)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_and_tool_result(claude, stream):
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    kw = dict(model="smollm2", max_tokens=60, extra_body=GREEDY, tools=ANTHROPIC_TOOLS,
              tool_choice={"type": "tool", "name": "get_weather"})
    if stream:
        with claude.messages.stream(messages=ask, **kw) as s:
            r = s.get_final_message()
    else:
        r = claude.messages.create(messages=ask, **kw)
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER["parameters"])
    history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                             "content": json.dumps({"temperature_c": 31})}]}]
    answer = claude.messages.create(model="smollm2", max_tokens=16, extra_body=GREEDY, messages=history,
                                    tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"


@pytest.mark.parametrize("body, message", [
    ({"messages": ASK, "max_tokens": 5}, "model"),
    ({"model": "m", "messages": ASK}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": ASK}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "image"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "temperature": 1.5}, "temperature"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "stop_sequences": "x"}, "stop_sequences"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "tools": [{"type": "web_search_20250305"}]}, "custom"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "tools": ANTHROPIC_TOOLS,
      "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"model": "m", "max_tokens": 5, "messages": ASK, "thinking": {"type": "enabled"}}, "budget_tokens"),
])
def test_messages_bad_requests_are_400_in_anthropics_shape(server, body, message):
    r = httpx.post(server[0] + "/v1/messages", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert message in err["error"]["message"]


def test_messages_count_tokens(claude):
    counted = claude.messages.count_tokens(model="m", system="Answer briefly.", messages=ASK)
    r = claude.messages.create(model="m", max_tokens=1, system="Answer briefly.", messages=ASK)
    assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)


def test_messages_client_raises_typed_errors(claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [{"type": "image"}]}])


def test_messages_api_key_by_x_api_key(model):
    with live_server(model, parallel=1, api_key="sekrit") as (url, _srv):
        ok = anthropic.Anthropic(base_url=url, api_key="sekrit", max_retries=0, timeout=60)
        assert ok.messages.create(model="m", max_tokens=2, messages=ASK).usage.output_tokens <= 2
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=2, messages=ASK)


# --- Responses ---


def test_responses_equal_the_chat_completion(oai):
    text, finish = chat_text(oai, [{"role": "system", "content": "Answer briefly."}, *ASK])
    r = oai.responses.create(model="smollm2", input="Name a colour.", instructions="Answer briefly.",
                             max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.output_text == text and r.output[0].type == "message"
    assert r.status == ("incomplete" if finish == "length" else "completed")
    assert r.usage.output_tokens <= 12 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    items = oai.responses.create(model="smollm2", max_output_tokens=12, temperature=0, input=[
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}])
    assert items.output_text == text


def test_responses_stream(oai):
    kw = dict(model="smollm2", input="Say hi.", max_output_tokens=10, temperature=0)
    whole = oai.responses.create(**kw)
    events = list(oai.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text


def test_responses_json_schema(oai):
    fmt = {"format": {"type": "json_schema", "name": "colour", "schema": SCHEMA, "strict": True}}
    r = oai.responses.create(model="smollm2", input="Give a colour and its hex code as JSON.", text=fmt,
                             max_output_tokens=60, temperature=0)
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    streamed = list(oai.responses.create(model="smollm2", input="Give a colour and its hex code as JSON.", text=fmt,
                                         max_output_tokens=60, temperature=0, stream=True))
    assert json.loads("".join(e.delta for e in streamed if e.type == "response.output_text.delta")) == \
        json.loads(r.output_text)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_call_and_output(oai, stream):
    kw = dict(model="smollm2", input="What is the weather like in Paris today?", tools=RESPONSES_TOOLS,
              tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60, temperature=0)
    if stream:
        events = list(oai.responses.create(**kw, stream=True))
        assert any(e.type == "response.function_call_arguments.done" for e in events)
        r = events[-1].response
    else:
        r = oai.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and r.status == "completed"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow = oai.responses.create(model="smollm2", max_output_tokens=16, temperature=0, tools=RESPONSES_TOOLS,
                                  tool_choice="none", input=[
                                      {"role": "user", "content": "What is the weather like in Paris today?"},
                                      {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                                       "arguments": calls[0].arguments},
                                      {"type": "function_call_output", "call_id": calls[0].call_id,
                                       "output": json.dumps({"temperature_c": 31})}])
    assert follow.output_text


@pytest.mark.parametrize("body, message", [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text"),
    ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "function"),
    ({"model": "m", "input": "hi", "text": {"format": {"type": "json_schema"}}}, "schema"),
    ({"model": "m", "input": "hi", "max_output_tokens": "many"}, "max_tokens"),
    ({"model": "m", "input": "hi", "temperature": -1}, "temperature"),
])
def test_responses_bad_requests_are_400(server, body, message):
    r = httpx.post(server[0] + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"


# --- reasoning ---


class Thinking(Scripted):
    """A scripted reply with SmolLM2's template made a thinking one: the llama family splits `<think>`."""

    def __init__(self, model, reply: str, template: str):
        super().__init__(model, reply)
        self.chat_template = template


@pytest.fixture(scope="module")
def thinker(model):
    template = model.chat_template.replace(OPEN, OPEN + "{# <think> #}")
    assert template != model.chat_template
    scripted = Thinking(model, "<think>\nThe user wants a colour.\n</think>\n\nBlue.", template)
    with live_server(scripted, parallel=1) as (url, _srv):
        yield url


def test_reasoning_in_chat_completions(thinker):
    client = openai.OpenAI(base_url=thinker + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0)
    message = r.choices[0].message
    assert (message.content, message.reasoning_content) == ("Blue.", "The user wants a colour.")
    chunks = list(client.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "The user wants a colour."
    assert "".join(d.content or "" for d in deltas) == "Blue."


def test_reasoning_as_thinking_blocks(thinker):
    client = anthropic.Anthropic(base_url=thinker, api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="m", max_tokens=40, messages=ASK, extra_body=GREEDY,
              thinking={"type": "enabled", "budget_tokens": 1024})
    r = client.messages.create(**kw)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in r.content] == \
        [("thinking", "The user wants a colour."), ("text", "Blue.")]
    with client.messages.stream(**kw) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and "text_delta" in kinds
    assert final.content[0].thinking == "The user wants a colour." and final.content[1].text == "Blue."


def test_reasoning_as_responses_items(thinker):
    client = openai.OpenAI(base_url=thinker + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.responses.create(model="m", input="Name a colour.", max_output_tokens=40, temperature=0)
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == "Blue."
    assert r.output[0].content[0].text == "The user wants a colour."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(model="m", input="Name a colour.", max_output_tokens=40, temperature=0,
                                         stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "The user wants a colour."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Blue."


def test_a_template_that_opens_the_thinking_and_enable_thinking(model):
    thinking = Thinking(model, "", model.chat_template.replace(OPEN, THINKING))
    assert "<think>" in thinking.chat_template
    real = type("Real", (), {})()  # SmolLM2 itself under the thinking template: its reply starts in the thinking
    real.__dict__.update({k: getattr(model, k) for k in ("descriptor", "tokenizer", "caps", "init_cache",
                                                           "forward_step", "forward_step_batch")})
    real.chat_template = thinking.chat_template
    with live_server(real, parallel=1) as (url, _srv):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0).choices[0]
        assert r.message.reasoning_content and not r.message.content and r.finish_reason == "length"
        off = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert off.choices[0].message.content and getattr(off.choices[0].message, "reasoning_content", None) is None
        effort = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0,
                                                reasoning_effort="none")
        assert effort.choices[0].message.content == off.choices[0].message.content
        items = client.responses.create(model="m", input="Name a colour.", max_output_tokens=8, temperature=0,
                                        reasoning={"effort": "none"})
        assert [o.type for o in items.output] == ["message"] and items.output_text == off.choices[0].message.content
        claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
        off = claude.messages.create(model="m", max_tokens=8, extra_body=GREEDY, messages=ASK,
                                     thinking={"type": "disabled"})
        assert [b.type for b in off.content] == ["text"]
        # a reasoning budget: the thinking is closed after 3 tokens, then the model answers
        cut = client.chat.completions.create(model="m", messages=ASK, max_tokens=16, temperature=0,
                                             extra_body={"reasoning_budget": 3}).choices[0].message
        assert cut.content and r.message.reasoning_content.startswith(cut.reasoning_content)
        assert len(model.tokenizer.encode(cut.reasoning_content, add_special=False)) <= 3
        blocks = claude.messages.create(model="m", max_tokens=16, extra_body=GREEDY, messages=ASK,
                                        thinking={"type": "enabled", "budget_tokens": 3})
        assert [(b.type, getattr(b, "thinking", getattr(b, "text", None))) for b in blocks.content] == \
            [("thinking", cut.reasoning_content), ("text", cut.content)]


# --- n > 1 ---


def computed_prompt_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("archrun_prompt_tokens_computed_total")))


def test_n_choices_share_the_prompt_and_decode_together(server, oai):
    msgs = [{"role": "user", "content": "List three fruits that are red, please."}]
    one = oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
    before = computed_prompt_tokens(server[0])
    msgs = [{"role": "user", "content": "Name three animals that live in the sea, please."}]
    r = oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, n=3)
    computed = computed_prompt_tokens(server[0]) - before
    alone = oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert {c.message.content for c in r.choices} == {alone.choices[0].message.content}  # greedy: equal choices
    assert r.usage.completion_tokens == 3 * alone.usage.completion_tokens
    assert r.usage.prompt_tokens == alone.usage.prompt_tokens
    assert computed <= r.usage.prompt_tokens + 2 < 3 * r.usage.prompt_tokens  # the prompt once, its last token again
    assert one.choices[0].message.content


def test_n_choices_streamed_and_seeded(oai):
    msgs = [{"role": "user", "content": "Write a word."}]
    kw = dict(model="m", messages=msgs, max_tokens=6, temperature=1.0, seed=7, n=3)
    whole = oai.chat.completions.create(**kw)
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finish[c.index] = c.finish_reason or finish.get(c.index)
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert texts == {c.index: c.message.content for c in whole.choices}  # the same seeds: the same choices
    assert set(finish) == {0, 1, 2} and all(finish.values())


@pytest.mark.parametrize("n", [0, 17, "3"])
def test_bad_n_is_400(server, n):
    r = httpx.post(server[0] + "/v1/chat/completions", timeout=30,
                   json={"model": "m", "messages": ASK, "max_tokens": 2, "n": n})
    assert r.status_code == 400 and "n" in r.json()["error"]["message"]
