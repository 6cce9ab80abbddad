"""`archrun serve` driven by the openai client against the real SmolLM2 model (greedy output equals
archrun.generate/chat on the same cache state; streaming, completions, logprobs, prefix reuse)."""

from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest
from support.live_server import live_server
from support.models import real_model

import archrun
from archrun.run.cache import PrefixCache

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def model():
    return archrun.load(real_model("smollm2"))


@pytest.fixture(scope="module")
def server(model):
    # one slot: every request runs in the same cache, so a PrefixCache in the test mirrors it exactly
    with live_server(model, parallel=1, prefill_chunk=512) as (url, srv):
        yield url, srv, PrefixCache(model.init_cache(srv.ctx))


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(role_text: str) -> list[dict]:
    return [{"role": "user", "content": role_text}]


def test_chat_greedy_equals_archrun_chat(model, server, client):
    msgs = ask("Name a colour.")
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=12, temperature=0)
    ref = archrun.chat(model, msgs, max_tokens=12, temperature=0, cache=server[2]).complete()
    assert r.choices[0].message.content == ref.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ref.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (ref.prompt_tokens, ref.completion_tokens)
    assert r.usage.total_tokens == ref.prompt_tokens + ref.completion_tokens
    assert r.object == "chat.completion" and r.model == "smollm2"


def test_chat_stream_equals_archrun_chat_with_usage(model, server, client):
    msgs = ask("Say hello to the moon.")
    stream = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    ref = archrun.chat(model, msgs, max_tokens=10, temperature=0, cache=server[2]).complete()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ref.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == ref.cached_tokens


def test_completion_greedy_equals_generate_and_streams_the_same(model, server, client):
    prompt = "The three primary colours are"
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    ref = archrun.generate(model, prompt, max_tokens=8, temperature=0, cache=server[2]).complete()
    assert r.choices[0].text == ref.text and r.object == "text_completion"
    again = client.completions.create(model="smollm2", prompt="A river flows", max_tokens=8, temperature=0,
                                      stream=True)
    ref = archrun.generate(model, "A river flows", max_tokens=8, temperature=0, cache=server[2]).complete()
    assert "".join(c.choices[0].text for c in again) == ref.text


def test_chat_logprobs_in_openai_format(model, server, client):
    msgs = ask("Count to three.")
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    ref = archrun.chat(model, msgs, max_tokens=6, temperature=0, logprobs=3, cache=server[2]).complete()
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == len(ref.logprobs)
    for entry, mine in zip(content, ref.logprobs, strict=True):
        assert entry.bytes == list(model.tokenizer.token_to_piece(mine.token))
        assert entry.logprob == pytest.approx(mine.logprob) and entry.logprob <= 0
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token  # greedy: the best
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs),
                                                                 reverse=True)
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_completion_logprobs_stream(model, server, client):
    stream = client.completions.create(model="smollm2", prompt="Water boils at", max_tokens=5, temperature=0,
                                       logprobs=2, stream=True)
    chunks = [c for c in stream if c.choices[0].logprobs]
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert len(tokens) == 5 and offsets == list(np.cumsum([0] + [len(t) for t in tokens[:-1]]))
    tops = [d for c in chunks for d in c.choices[0].logprobs.top_logprobs]
    assert all(len(d) == 2 for d in tops)
    archrun.generate(model, "Water boils at", max_tokens=5, temperature=0, cache=server[2]).complete()


def test_seed_stop_and_penalties(model, server, client):
    # a cached prefix would be reused and round differently from a whole prefill: cache_prompt off
    kw = dict(model="smollm2", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=7,
              frequency_penalty=0.5, logit_bias={"13": -100}, extra_body={"cache_prompt": False})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b
    stop = client.completions.create(**{**kw, "stop": [a[3:6]]}).choices[0]
    assert stop.text == a[:3] and stop.finish_reason == "stop"
    server[2].reset()  # the sampled requests moved the server's cache; the mirror starts over
    archrun.generate(model, "Once upon a time", max_tokens=1, temperature=0, cache=server[2]).complete()


def test_next_chat_turn_reuses_the_cached_conversation(model, server, client):
    history = ask("Tell me a fact about cats.")
    first = client.chat.completions.create(model="smollm2", messages=history, max_tokens=16, temperature=0)
    archrun.chat(model, history, max_tokens=16, temperature=0, cache=server[2]).complete()
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And one about dogs?"}]
    second = client.chat.completions.create(model="smollm2", messages=history, max_tokens=8, temperature=0)
    ref = archrun.chat(model, history, max_tokens=8, temperature=0, cache=server[2]).complete()
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == ref.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens - 2
    assert second.usage.prompt_tokens - cached < 20  # only the new turn is computed
    assert second.choices[0].message.content == ref.text


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    url = server[0]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    text = httpx.get(url + "/metrics").text
    for name in ("archrun_requests_total{", "archrun_generation_tokens_total", "archrun_queue_depth",
                 "archrun_batch_size", "archrun_generation_tokens_per_second", "archrun_prompt_tokens_computed_total"):
        assert name in text
    assert 'endpoint="/v1/chat/completions",status="200"' in text
    assert "model=" not in text  # one model: its series carry no model label


def test_concurrent_streams_batch_and_match_single_runs(model):
    prompts = ["Snow is", "The sun rises in the", "My favourite fruit is"]
    refs = [archrun.generate(model, p, max_tokens=10, temperature=0).complete().text for p in prompts]
    with live_server(model, parallel=3) as (url, srv):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

        def run(prompt):
            return client.completions.create(model="smollm2", prompt=prompt, max_tokens=10, temperature=0)

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            outs = list(pool.map(run, prompts))
        assert [o.choices[0].text for o in outs] == refs
        assert srv.metrics.steps < sum(o.usage.completion_tokens for o in outs)  # steps were shared


def test_system_fingerprint_and_logit_hashes_match_a_run_alone(model, server, client):
    """The fingerprint names what computed the answer; the logit hashes asked for are the hashes of the same
    request run alone (archrun.generate with logit_hashes=True), step for step."""
    from archrun.generation.fingerprint import system_fingerprint

    fp = system_fingerprint(model)
    assert fp.startswith("fp_") and len(fp) == 19
    r = client.completions.create(model="smollm2", prompt="The moon is", max_tokens=6, temperature=0,
                                  extra_body={"logit_hashes": True})
    ref = archrun.generate(model, "The moon is", max_tokens=6, temperature=0, logit_hashes=True,
                           cache=server[2]).complete()
    assert r.system_fingerprint == fp and r.choices[0].text == ref.text
    assert r.choices[0].model_extra["logit_hashes"] == list(ref.logit_hashes)
    stream = client.completions.create(model="smollm2", prompt="The moon is", max_tokens=6, temperature=0,
                                       stream=True, extra_body={"logit_hashes": True})
    chunks = list(stream)
    assert {c.system_fingerprint for c in chunks} == {fp}
    assert chunks[-1].choices[0].model_extra["logit_hashes"] == list(ref.logit_hashes)
