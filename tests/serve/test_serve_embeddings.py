"""POST /v1/embeddings on `archrun serve`, driven by the official `openai` client against real servers on
loopback: SmolLM2 mean-pooled (no real embedding GGUF ships in a PyPI package; SmolLM2's file states no
pooling, so the server runs with --pooling mean) ranks related sentences above unrelated ones and
answers what archrun.embed computes; the tiny encoders of archrun-bert serve embeddings and refuse to
generate; bad inputs are 4xx and the server stays alive."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest
from support.live_server import live_app, live_server
from support.models import real_model

import archrun
from archrun.serve import ServeConfig, create_app

openai = pytest.importorskip("openai")

BERT_GOLDENS = Path(__file__).parents[2] / "families" / "archrun-bert" / "tests" / "goldens"
# three pairs of related sentences and one unrelated to all
SENTENCES = ["The cat sat on the mat.", "A kitten was sleeping on the rug.",
             "I love eating pizza with cheese.", "Pasta and pizza are my favourite Italian foods.",
             "The rocket launched into orbit around the Earth.", "Astronauts travelled to space on a spaceship.",
             "The stock market fell sharply today."]
PAIRS = ((0, 1), (2, 3), (4, 5))


@pytest.fixture(scope="module")
def smollm2():
    return archrun.load(real_model("smollm2"))


@pytest.fixture(scope="module")
def server(smollm2):
    with live_server(smollm2, parallel=1, pooling="mean") as (url, srv):
        yield url, srv


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_related_sentences_rank_above_unrelated(oai, smollm2):
    r = oai.embeddings.create(model="smollm2", input=SENTENCES)  # the client asks for base64 and decodes it
    e = np.array([d.embedding for d in sorted(r.data, key=lambda d: d.index)], np.float32)
    assert e.shape == (len(SENTENCES), smollm2.descriptor.n_embd)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    cos = e @ e.T
    for a, b in PAIRS:
        for i, j in ((a, b), (b, a)):
            others = [k for k in range(len(SENTENCES)) if k != i]
            assert max(others, key=lambda k: cos[i, k]) == j, f"{SENTENCES[i]!r}: {np.round(cos[i], 3)}"
    np.testing.assert_array_equal(e, archrun.embed(smollm2, SENTENCES, pooling="mean"))
    n_tokens = sum(len(smollm2.tokenizer.encode(s)) for s in SENTENCES)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens


def test_float_format_and_token_ids(oai, smollm2):
    ids = smollm2.tokenizer.encode(SENTENCES[0])
    as_text = oai.embeddings.create(model="smollm2", input=SENTENCES[0], encoding_format="float")
    as_ids = oai.embeddings.create(model="smollm2", input=ids, encoding_format="float")
    as_lists = oai.embeddings.create(model="smollm2", input=[ids, ids[:3]], encoding_format="float")
    assert as_text.data[0].embedding == as_ids.data[0].embedding == as_lists.data[0].embedding
    assert len(as_lists.data) == 2 and as_lists.usage.prompt_tokens == len(ids) + 3


def test_base64_is_float32_little_endian(server):
    r = httpx.post(server[0] + "/v1/embeddings", json={"input": "hi", "encoding_format": "base64"}, timeout=300)
    f = httpx.post(server[0] + "/v1/embeddings", json={"input": "hi"}, timeout=300)
    got = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(got, np.array(f.json()["data"][0]["embedding"], np.float32))
    assert r.json()["object"] == "list" and r.json()["data"][0]["object"] == "embedding"


@pytest.mark.parametrize("body", [
    {}, {"input": []}, {"input": ""}, {"input": ["ok", ""]}, {"input": [[]]}, {"input": [[-1]]},
    {"input": [10**9]}, {"input": [1.5]}, {"input": None}, {"input": {"text": "hi"}}, {"input": [["a"]]},
    {"input": "hi", "encoding_format": "hex"}, {"input": "hi", "dimensions": 3}, {"input": "hi", "dimensions": True},
    {"input": [1] * 9000},
])
def test_bad_inputs_are_400_and_the_server_stays_alive(server, body):
    r = httpx.post(server[0] + "/v1/embeddings", json=body, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(server[0] + "/v1/embeddings", json={"input": "still here"}, timeout=300).status_code == 200


def test_malformed_json_is_400(server):
    r = httpx.post(server[0] + "/v1/embeddings", content=b"{not json", timeout=300,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400


@pytest.fixture(scope="module")
def encoders():
    bert = archrun.load(BERT_GOLDENS / "bert_tiny.gguf")
    nomic = archrun.load(BERT_GOLDENS / "nomic_bert_tiny.gguf")
    with live_app(create_app(bert, ServeConfig(port=0), "bert")) as bert_url, \
            live_app(create_app(nomic, ServeConfig(port=0), "nomic")) as nomic_url:
        yield {"bert": (bert_url, bert), "nomic": (nomic_url, nomic)}


def test_an_encoder_serves_embeddings_and_refuses_to_generate(encoders):
    url, nomic = encoders["nomic"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.embeddings.create(model="nomic", input=["hello there", "hello"])
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32),
                                  archrun.embed(nomic, ["hello there", "hello"]))  # the file states mean
    with pytest.raises(openai.BadRequestError, match="encoder"):
        client.chat.completions.create(model="nomic", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="encoder"):
        client.completions.create(model="nomic", prompt="hi", max_tokens=2)
    assert httpx.get(url + "/health").status_code == 200


def test_a_file_without_pooling_needs_the_flag(encoders):
    url, _ = encoders["bert"]  # llama.cpp's converter wrote no pooling_type, and the server has no --pooling
    r = httpx.post(url + "/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400 and "states no pooling" in r.json()["error"]["message"]
