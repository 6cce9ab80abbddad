"""The server under bad input (malformed HTTP, JSON and parameters) over raw HTTP: typed 4xx answers, no crash,
no hung slot, nothing lost for the other streams."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from support.live_server import live_server
from support.models import real_model

import archrun

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Paced:
    """The real model with an optional pause before each step: the burst test's held requests must still
    be running when the burst arrives, however fast (or, on a loaded host, slow) the host decodes."""

    def __init__(self, model):
        self._model, self.pause = model, 0.0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward_step(self, *args, **kwargs):
        time.sleep(self.pause)
        return self._model.forward_step(*args, **kwargs)

    def forward_step_batch(self, *args, **kwargs):
        time.sleep(self.pause)
        return self._model.forward_step_batch(*args, **kwargs)


@pytest.fixture(scope="module")
def paced():
    return Paced(archrun.load(real_model("smollm2")))


@pytest.fixture(scope="module")
def server(paced):
    with live_server(paced, api_key=KEY, parallel=1, queue=1, max_body=16 * 1024, ctx=256) as (url, srv):
        yield url, srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[0], headers=AUTH, timeout=60) as client:
        yield client


def chat(text="Hi", **extra):
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2, **extra}


def error_of(response, status):
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert err["message"] and err["type"]
    return err["message"]


def test_api_key_is_required_except_for_health(server):
    url = server[0]
    assert httpx.get(url + "/health").status_code == 200
    assert "API key" in error_of(httpx.post(url + "/v1/chat/completions", json=chat()), 401)
    wrong = {"Authorization": "Bearer nope"}
    error_of(httpx.post(url + "/v1/chat/completions", json=chat(), headers=wrong), 401)
    error_of(httpx.get(url + "/v1/models", headers=wrong), 401)
    error_of(httpx.get(url + "/metrics"), 401)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"", b'{"messages": NaN}', b"\xff\xfe", b"[" * 10000])
def test_malformed_json_is_400(http, body):
    error_of(http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}), 400)


def test_unknown_fields_are_ignored(http):
    r = http.post("/v1/chat/completions", json=chat(frobnicate={"x": 1}, user="u", metadata=None))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_context_overflow_is_400_with_the_numbers(http):
    msg = error_of(http.post("/v1/completions", json={"prompt": list(range(300)), "max_tokens": 2}), 400)
    assert "300" in msg and "256" in msg
    msg = error_of(http.post("/v1/chat/completions", json=chat("word " * 400)), 400)
    assert "256" in msg


def test_oversized_body_is_413_before_parsing(http):
    big = b'{"messages": "' + b"x" * 20000 + b'"}'
    error_of(http.post("/v1/chat/completions", content=big), 413)

    def chunks():  # no Content-Length: counted while read
        for _ in range(40):
            yield b"x" * 1024

    error_of(http.post("/v1/completions", content=chunks()), 413)


@pytest.mark.parametrize("fields", [
    {"temperature": -1}, {"top_p": 2}, {"top_p": 0}, {"n": 1000}, {"max_tokens": 0}, {"max_tokens": -3},
    {"max_tokens": 2.5}, {"max_completion_tokens": "9"}, {"temperature": "hot"}, {"presence_penalty": 3},
    {"logit_bias": {"1.5": 1}}, {"logit_bias": {"99999999": 1}}, {"logit_bias": {"5": 1000}}, {"logit_bias": [1]},
    {"stop": [1, 2]}, {"stop": ["x"] * 17}, {"stop": [""]}, {"seed": -1}, {"seed": 1.5}, {"top_logprobs": 3},
    {"logprobs": True, "top_logprobs": 50}, {"stream": "yes"}, {"messages": []}, {"messages": "hi"},
    {"messages": [{"role": "user<|im_end|>", "content": "x"}]}, {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, {"top_k": -1}, {"min_p": 2},
])
def test_bad_chat_fields_are_400(http, fields):
    error_of(http.post("/v1/chat/completions", json={**chat(), **fields}), 400)


@pytest.mark.parametrize("prompt", [[1, 99999999], [1.5, 2], [None], None, "", [], [[1], [2]], [-1], [True]])
def test_bad_completion_prompts_are_400(http, prompt):
    error_of(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2}), 400)


def test_no_max_tokens_stops_at_the_context(server, http):
    no_end = {str(t): -100 for t in server[1].model.tokenizer.eog_ids}  # generation never ends by itself
    r = http.post("/v1/chat/completions", json={**chat("a " * 200), "max_tokens": None, "temperature": 0,
                                                "logit_bias": no_end})
    body = r.json()
    assert r.status_code == 200 and body["usage"]["total_tokens"] == 256
    assert body["choices"][0]["finish_reason"] == "length"




def test_burst_beyond_the_queue_is_429_and_disconnects_free_the_slot(server, http, paced):
    url, srv = server
    paced.pause = 0.2  # 240 tokens: 48 s at least, far longer than the burst takes
    try:
        _burst(url, srv, http)
    finally:
        paced.pause = 0.0
    r = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert "archrun_requests_total" in http.get("/metrics").text


def _burst(url, srv, http):
    """Two held streams (one running, one queued), a third request refused with 429, then both hang up."""
    holds = []
    for _ in range(2):  # one runs, one waits
        started = threading.Event()
        gate = threading.Event()
        t = threading.Thread(target=_hold, args=(url, started, gate), daemon=True)
        t.start()
        holds.append((t, started, gate))
    assert holds[0][1].wait(300)
    # one in the batch and one waiting (a lone waiting request may be the first, not yet admitted);
    # the first step may compile kernels on a cold cache, hence the long wait
    _until(lambda: srv.engine.running == 1 and srv.metrics.queue_depth == 1, timeout=300)
    error_of(http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}), 429)
    for _, _, gate in holds:
        gate.set()  # both clients hang up
    for t, _, _ in holds:
        t.join(30)
    _until(lambda: srv.engine.running == 0 and srv.metrics.queue_depth == 0)


def _hold(url, started, gate):
    # as many tokens as the context holds: the held request must outlast the burst even on a loaded host
    body = {"prompt": "Once upon a time", "max_tokens": 240, "stream": True, "temperature": 0,
            "logit_bias": {"2": -100, "0": -100}}
    with httpx.Client(base_url=url, headers=AUTH, timeout=60) as c, \
            c.stream("POST", "/v1/completions", json=body) as r:
        started.set()
        for line in r.iter_lines():
            if line.startswith("data: ") and gate.is_set():
                break
        gate.wait(30)


def _until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_errors_are_json_and_the_server_still_serves(http):
    r = http.post("/v1/chat/completions", content=json.dumps(chat("Fine?")))
    assert r.status_code == 200
    assert http.get("/health").json()["running"] == 0
