"""Structured output through `archrun serve`, driven by the openai client on the real SmolLM2 model:
response_format json_object and json_schema (sampled outputs parse and validate), invalid schemas 400."""

from __future__ import annotations

import concurrent.futures
import json

import jsonschema
import pytest
from support.live_server import live_server
from support.models import real_model

import archrun

openai = pytest.importorskip("openai")

ORDER = {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "additionalProperties": False, "required": ["name", "vip"],
                     "properties": {"name": {"type": "string", "maxLength": 20}, "vip": {"type": "boolean"}}},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 9}}}},
        "priority": {"enum": ["low", "normal", "high"]},
    },
    "required": ["customer", "items", "priority"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Write an order for a shop as JSON."}]


@pytest.fixture(scope="module")
def client():
    model = archrun.load(real_model("smollm2"))
    with live_server(model, parallel=8) as (url, _srv):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_object(client):
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=60, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_twenty_sampled_generations_validate_against_a_nested_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}

    def one(seed: int):
        return client.chat.completions.create(model="m", messages=ASK, max_tokens=300, temperature=1.0,
                                              top_p=0.95, seed=seed, response_format=fmt)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(20)))
    texts = [r.choices[0].message.content for r in replies]
    assert all(r.choices[0].finish_reason == "stop" for r in replies), texts
    for text in texts:
        jsonschema.validate(json.loads(text), ORDER)
    assert len(set(texts)) > 1  # sampled, not one answer repeated


def test_streamed_json_schema(client):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 2 + 2? Reply in JSON."}], max_tokens=30,
        temperature=0, stream=True, response_format={"type": "json_schema", "json_schema": {"name": "a",
                                                                                           "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert set(json.loads(text)) == {"answer"}


def test_completions_take_a_response_format(client):
    r = client.completions.create(model="m", prompt="A list of three colours:", max_tokens=60, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "c", "schema": {"type": "array", "items": {"type": "string"},
                                                              "minItems": 3, "maxItems": 3}}}})
    assert len(json.loads(r.choices[0].text)) == 3


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}},
    {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"$ref": "#/definitions/missing"}}},
    {"type": "json_schema", "json_schema": {"name": "bad", "schema": [1]}},
    {"type": "json_schema"},
    {"type": "yaml"},
])
def test_invalid_formats_are_400(client, fmt):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=5, response_format=fmt)
    assert e.value.status_code == 400
