"""Several models in one `archrun serve` under a memory budget (the real SmolLM2 135M Q4_1 file under two names,
each loaded as its own model with its own engine: a second real model would cost minutes of kernel compilation
on a cold CI machine), driven with the official openai and anthropic clients against a real server on
loopback: the request's model selects, /v1/models lists each model's facts, the least recently used idle model
is unloaded to make room, a model too large for the budget and a load while memory is busy are answered 503
(the server goes on), /health reports a stalled engine (a step blocked through the engine's test hook) and
recovers; a KV cap answers a request that could never fit with 400, one that cannot fit now with 503."""

from __future__ import annotations

import os
import shutil
import threading
import time

import httpx
import pytest
from support.live_server import live_app, live_server
from support.models import real_model

import archrun
from archrun.generation.generate import make_request
from archrun.serve.config import ServeConfig
from archrun.serve.engine import Engine
from archrun.serve.front import create_pool_app
from archrun.serve.memory import MemoryBudget, MemoryBudgetExceeded, parse_bytes
from archrun.serve.models import model_files

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

BUDGET = 150_000_000  # one SmolLM2 (98 MB) fits, not two; the padded file (200 MB) never
ASK = [{"role": "user", "content": "Name a colour."}]
SMOL, TWIN, HUGE = "SmolLM2-135M-Instruct.Q4_1.gguf", "twin.gguf", "huge.gguf"


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    smol, folder = real_model("smollm2"), tmp_path_factory.mktemp("models")
    (folder / TWIN).symlink_to(smol)   # the same file under a second name: a second model
    huge = folder / HUGE  # SmolLM2's file padded (sparse) past the budget
    shutil.copyfile(smol, huge)
    os.truncate(huge, 200_000_000)
    config = ServeConfig(port=0, parallel=1, ctx=256, max_memory=BUDGET, watchdog=1.0)
    app = create_pool_app(model_files([smol], folder), archrun.load, config)
    with live_app(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def oai(front):
    return openai.OpenAI(base_url=front[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def loaded(front) -> set[str]:
    return {m["id"] for m in httpx.get(front[0] + "/v1/models", timeout=30).json()["data"] if m["loaded"]}


def ask(oai, model: str, max_tokens: int = 6, **kw):
    return oai.chat.completions.create(model=model, messages=ASK, max_tokens=max_tokens, temperature=0, **kw)


def test_models_lists_each_model_with_its_facts(front, oai):
    listed = {m.id: m.model_dump() for m in oai.models.list().data}
    assert list(listed) == [SMOL, HUGE, TWIN]  # the paths given, then --models-dir's files
    smol, twin, huge = listed[SMOL], listed[TWIN], listed[HUGE]
    assert (smol["architecture"], smol["quantization"], smol["n_ctx_train"]) == ("llama", "Q4_1", 8192)
    assert 130e6 < smol["parameters"] < 140e6 and smol["context_length"] == 256
    assert smol["file_bytes"] == os.path.getsize(real_model("smollm2")) and huge["file_bytes"] == 200_000_000
    assert smol["loaded"] and not twin["loaded"] and not huge["loaded"]  # the first loads at start


def test_the_requests_model_selects_and_the_lru_idle_model_unloads(front, oai):
    a = ask(oai, SMOL)
    assert a.model == SMOL and a.choices[0].message.content and loaded(front) == {SMOL}
    first = dict(front[1].pool.servers())[SMOL]
    b = ask(oai, TWIN)  # both do not fit: the idle first model is unloaded to load the second
    assert b.model == TWIN and b.choices[0].message.content == a.choices[0].message.content
    assert loaded(front) == {TWIN} and not first.engine._thread.is_alive()  # its engine stopped
    claude = anthropic.Anthropic(base_url=front[0], api_key="unused", max_retries=0, timeout=120)
    m = claude.messages.create(model="twin", max_tokens=6, messages=ASK, extra_body={"temperature": 0})
    assert m.model == TWIN and m.content[0].text == b.choices[0].message.content  # the name without .gguf
    assert ask(oai, SMOL).choices[0].message.content == a.choices[0].message.content
    assert loaded(front) == {SMOL}
    assert front[1].pool.budget.used <= BUDGET


def series(url: str) -> dict[str, float]:
    """/metrics as {series with its labels: value}; each family's HELP and TYPE once."""
    lines = httpx.get(url + "/metrics", timeout=30).text.splitlines()
    heads = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(heads) == len(set(heads))
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def test_metrics_label_each_models_series(front, oai):
    tokens = sum(ask(oai, name).usage.completion_tokens for name in (TWIN, SMOL))  # TWIN is unloaded after
    before = series(front[0])
    assert before[f'archrun_generation_tokens_total{{model="{TWIN}"}}'] >= tokens / 2 > 0  # kept while unloaded
    chat = f'archrun_requests_total{{model="{SMOL}",endpoint="/v1/chat/completions",status="200"}}'
    assert before[chat] >= 1 and before[f'archrun_queue_depth{{model="{SMOL}"}}'] == 0
    assert not any(key.startswith("archrun_generation_tokens_total ") for key in before)  # only per model
    ask(oai, SMOL)
    after = series(front[0])
    scrapes = 'archrun_requests_total{endpoint="/metrics",status="200"}'  # the front's own: no model label
    assert after[chat] == before[chat] + 1 and after[scrapes] == before.get(scrapes, 0) + 1


def test_an_unknown_model_is_404_in_each_apis_shape(front, oai):
    with pytest.raises(openai.NotFoundError) as err:
        ask(oai, "no-such-model")
    assert err.value.status_code == 404 and "no-such-model" in err.value.message
    claude = anthropic.Anthropic(base_url=front[0], api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=4, messages=ASK)
    assert ask(oai, SMOL).choices[0].message.content  # alive


def test_a_model_too_large_for_the_budget_is_503_and_the_server_goes_on(front, oai):
    with pytest.raises(openai.InternalServerError) as err:
        ask(oai, HUGE)
    assert err.value.status_code == 503 and "--max-memory" in err.value.message
    assert HUGE not in loaded(front) and ask(oai, SMOL).choices[0].message.content


def test_a_model_larger_than_the_available_memory_is_503(front, oai, monkeypatch):
    from archrun.serve import models

    assert models.memory_available() > 0
    monkeypatch.setattr(models, "memory_available", lambda: 1000)
    with pytest.raises(openai.InternalServerError) as err:
        ask(oai, TWIN)
    assert err.value.status_code == 503 and "MemAvailable" in err.value.message
    assert loaded(front) == {SMOL}  # nothing was unloaded for it


def wait_for(check, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_stalled_engine_is_reported_by_health_and_holds_its_memory(front, oai):
    ask(oai, SMOL)
    url, app = front
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"
    engine = dict(app.pool.servers())[SMOL].engine
    release = threading.Event()
    engine.before_step = lambda: release.wait(60)  # the next step blocks until released
    answers = []
    worker = threading.Thread(target=lambda: answers.append(ask(oai, SMOL)))
    worker.start()
    try:
        stalled = wait_for(lambda: (r := httpx.get(url + "/health", timeout=30)).status_code == 503 and r)
        body = stalled.json()
        assert body["status"] == "unavailable" and "watchdog" in body["reason"] and SMOL in body["models"]
        # the first model is busy, so it cannot be unloaded: the second cannot get its memory now
        with pytest.raises(openai.InternalServerError) as err:
            ask(oai, TWIN)
        assert err.value.status_code == 503 and "in use" in err.value.message
    finally:
        engine.before_step = None
        release.set()
        worker.join(120)
    assert answers and answers[0].choices[0].message.content  # the stalled request finishes
    assert httpx.get(url + "/health", timeout=30).status_code == 200  # and the health recovers


def test_a_kv_cap_answers_400_for_a_request_that_never_fits(front, oai):
    model = dict(front[1].pool.servers())[SMOL].model  # the loaded SmolLM2, served alone with a KV cap
    with live_server(model, parallel=2, ctx=256, max_kv=3_000_000) as (url, server):  # 46 kB a token
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, "m", max_tokens=200)  # prompt + 200 tokens: about 11 MB of KV cache
        assert "KV cache" in err.value.message and "3000000" in err.value.message
        whole = {"extra_body": {"cache_prompt": False}}  # the whole prompt computed in both
        small = ask(client, "m", max_tokens=8, **whole)  # fits: a cache just big enough for it (a full one does not)
        assert small.choices[0].message.content == ask(oai, SMOL, max_tokens=8, **whole).choices[0].message.content
        assert server.engine.slot_bytes > 3_000_000 >= server.engine.kv_budgets[0].used > 0


def test_a_kv_cache_that_cannot_fit_now_is_503_before_allocation(front):
    model = dict(front[1].pool.servers())[SMOL].model
    budget = MemoryBudget(1_000_000, "--max-kv")
    assert budget.try_reserve(999_000)  # held by something else: not even this request's 10 tokens fit
    engine = Engine(model, parallel=1, ctx=64, queue=2, kv_budgets=(budget,), kv_limit=1_000_000)
    engine.start()
    try:
        events = []
        done = threading.Event()
        req = make_request(model, model.tokenizer.encode("Hello"), context=64, max_tokens=4)
        engine.submit(req, lambda e: (events.append(e), done.set() if e.error or e.result else None))
        assert done.wait(60)
        assert isinstance(events[-1].error, MemoryBudgetExceeded) and budget.used == 999_000
        budget.free(999_000)  # the memory comes back: the engine serves
        done.clear()
        engine.submit(req, lambda e: (events.append(e), done.set() if e.error or e.result else None))
        assert done.wait(60) and events[-1].result is not None
    finally:
        engine.stop()
        engine.release_memory()
    assert budget.used == 0


@pytest.mark.parametrize("text, expected", [("2GB", 2 * 10**9), ("512MiB", 512 * 2**20), ("1.5G", 1_500_000_000),
                                            ("1000", 1000), (4096, 4096)])
def test_memory_sizes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "2XB", "-1", "0", "GB", "1e9"])
def test_bad_memory_sizes(text):
    with pytest.raises(archrun.errors.InvalidRequest):
        parse_bytes(text)


class _Crash(BaseException):
    """Escapes the engine's per-step error handling (as a bug in the loop itself would)."""


def test_a_stopped_inference_thread_is_reported_and_refuses_new_work(front):
    from archrun.serve.engine import EngineDown

    model = dict(front[1].pool.servers())[SMOL].model
    engine = Engine(model, parallel=1, ctx=64, queue=2)
    engine.start()
    events, done = [], threading.Event()

    def crash():
        raise _Crash("injected")

    engine.before_step = crash
    req = make_request(model, model.tokenizer.encode("Hello"), context=64, max_tokens=4)
    engine.submit(req, lambda e: (events.append(e), done.set() if e.error else None))
    assert done.wait(60) and isinstance(events[-1].error, EngineDown)  # the request in it fails, not hangs
    engine._thread.join(30)
    why = engine.stalled(1.0)
    assert why is not None and "inference thread has stopped" in why and "_Crash" in why
    with pytest.raises(EngineDown):
        engine.submit(req, lambda e: None)
