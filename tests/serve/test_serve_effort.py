"""A reasoning effort (Responses' `reasoning.effort`, chat's `reasoning_effort`) on a thinking model whose
template has no `reasoning_effort` variable is a reasoning budget: EFFORT_SHARE of the reply's token budget
(SmolLM2 under a template that opens the thinking, so its greedy reply is all thinking until cut)."""

from __future__ import annotations

import httpx
import pytest
from support.live_server import live_server
from support.models import real_model

import archrun
from archrun.text.reasoning import EFFORT_SHARE, effort_budget, says_effort

openai = pytest.importorskip("openai")

OPEN = "{{ '<|im_start|>assistant\n' }}"
THINKING = "{{ '<|im_start|>assistant\n<think>\n' }}"
MAX = 30


def thinking_model(model, template: str):
    """SmolLM2 itself under `template`."""
    real = type("Real", (), {})()
    real.__dict__.update({k: getattr(model, k) for k in ("descriptor", "tokenizer", "caps", "init_cache",
                                                           "forward_step", "forward_step_batch")})
    real.chat_template = template
    return real


@pytest.fixture(scope="module")
def model():
    return archrun.load(real_model("smollm2"))


@pytest.fixture(scope="module")
def client(model):
    template = model.chat_template.replace(OPEN, THINKING)
    assert template != model.chat_template and not says_effort(template)
    with live_server(thinking_model(model, template), parallel=1) as (url, _srv):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_mapping():
    assert [effort_budget(e, 20) for e in ("minimal", "low", "medium", "high", "xhigh")] == [2, 4, 10, 16, 19]
    assert effort_budget("low", 2) == 1 and effort_budget("none", 20) is None and effort_budget("max", 20) is None
    assert list(EFFORT_SHARE.values()) == sorted(EFFORT_SHARE.values())


def thought(client, **kw) -> tuple[str, str]:
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name a colour."}],
                                       max_tokens=MAX, temperature=0, **kw).choices[0].message
    return r.reasoning_content or "", r.content or ""


@pytest.mark.parametrize("effort", ["low", "high"])
def test_an_effort_is_the_budget_of_its_share(client, effort):
    budget = effort_budget(effort, MAX)
    expected = thought(client, extra_body={"reasoning_budget": budget})
    unbounded = thought(client)
    assert unbounded[0].startswith(expected[0]) and len(unbounded[0]) > len(expected[0])  # the budget cut it
    assert thought(client, reasoning_effort=effort) == expected
    r = client.responses.create(model="m", input="Name a colour.", max_output_tokens=MAX, temperature=0,
                                reasoning={"effort": effort})
    assert [o.type for o in r.output] == ["reasoning", "message"][: 1 + bool(expected[1])]
    assert (r.output[0].content[0].text, r.output_text) == expected
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= budget


def test_a_budget_asked_for_comes_before_the_effort(client):
    assert thought(client, reasoning_effort="high", extra_body={"reasoning_budget": 2}) == \
        thought(client, extra_body={"reasoning_budget": 2})


def test_a_template_that_reads_the_effort_gets_no_budget(model):
    template = model.chat_template.replace(OPEN, THINKING + "{# reasoning_effort #}")
    with live_server(thinking_model(model, template), parallel=1) as (url, _srv):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        reasoning, content = thought(client, reasoning_effort="low")
    assert reasoning and not content  # all thinking, to the end of the reply's tokens


@pytest.mark.parametrize("body", [
    {"model": "m", "input": "hi", "reasoning": {"effort": "max"}},
    {"model": "m", "input": "hi", "reasoning": {"effort": 3}},
])
def test_an_unknown_effort_is_400(client, body):
    r = httpx.post(str(client.base_url) + "responses", json=body, timeout=30)
    assert r.status_code == 400 and "reasoning.effort" in r.text
    chat = httpx.post(str(client.base_url) + "chat/completions", timeout=30, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "max"})
    assert chat.status_code == 400 and "reasoning_effort" in chat.text
