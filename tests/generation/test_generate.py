"""Generation mechanics on a synthetic model (token texts are "<tN>", so decoded text is predictable)."""

import numpy as np
import pytest

import archrun
from archrun.errors import ContextOverflow, InvalidRequest


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from support.synth import write_model

    return archrun.load(write_model(tmp_path_factory.mktemp("gen") / "m.gguf", n_ctx=64, n_vocab=96))


def greedy_ids(model, prompt, n):
    cache = model.init_cache(len(prompt) + n)
    logits, out = model.forward_step(prompt, cache), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.forward_step([out[-1]], cache)
    return out


def test_greedy_generation_matches_argmax_chain(model):
    prompt = [5, 9, 13]
    gen = archrun.generate(model, prompt, max_tokens=8, temperature=0.0)
    pieces = list(gen)
    r = gen.result
    eog = model.tokenizer.eog_ids
    expected = greedy_ids(model, prompt, 8)
    cut = next((i for i, t in enumerate(expected) if t in eog), len(expected))
    assert list(r.token_ids) == expected[:cut]
    assert "".join(pieces) == r.text == model.tokenizer.decode(list(r.token_ids))
    assert r.prompt_tokens == 3 and r.completion_tokens == len(r.token_ids)
    assert r.finish_reason == ("length" if cut == 8 else "stop")
    assert set(r.timings) >= {"prompt_s", "generate_s", "prompt_tok_s", "generate_tok_s"}


def test_seeded_sampling_is_reproducible(model):
    a = archrun.generate(model, [3, 4], max_tokens=10, temperature=1.0, seed=11).complete()
    b = archrun.generate(model, [3, 4], max_tokens=10, temperature=1.0, seed=11).complete()
    assert a.token_ids == b.token_ids


def test_stop_string_truncates_and_never_streams_it(model):
    first = archrun.generate(model, [5, 9, 13], max_tokens=4, temperature=0.0).complete()
    if not first.token_ids:
        pytest.skip("model ends immediately")
    stop = model.tokenizer.decode(list(first.token_ids[:1]))
    gen = archrun.generate(model, [5, 9, 13], max_tokens=4, temperature=0.0, stop=[stop])
    streamed = "".join(gen)
    assert gen.result.text == streamed == "" and gen.result.finish_reason == "stop"


def test_stop_string_spanning_tokens(model):
    first = archrun.generate(model, [7], max_tokens=3, temperature=0.0).complete()
    if len(first.token_ids) < 2:
        pytest.skip("model ends too early")
    a, b = (model.tokenizer.decode([t]) for t in first.token_ids[:2])
    if len(a) < 2 or len(b) < 2:
        pytest.skip("single-character tokens")
    stop = a[1:] + b[:-1]  # starts inside token 1, ends inside token 2
    gen = archrun.generate(model, [7], max_tokens=3, temperature=0.0, stop=stop)
    assert "".join(gen) == gen.result.text == a[:1]


def test_no_max_tokens_stops_at_context(model):
    r = archrun.generate(model, [1] * 60, max_tokens=None, temperature=0.0, logit_bias={1: -100.0}).complete()
    assert r.completion_tokens <= 4


def test_prompt_longer_than_context(model):
    with pytest.raises(ContextOverflow):
        archrun.generate(model, [2] * 64, max_tokens=4)


@pytest.mark.parametrize("kw", [
    {"max_tokens": 0}, {"max_tokens": -5}, {"max_tokens": 2.5}, {"stop": [""]}, {"stop": [1, 2]},
    {"stop": ["x"] * 17}, {"stop": 5}, {"temperature": float("nan")}, {"bogus": 1}, {"logit_bias": {1000: 1.0}},
])
def test_bad_generation_options(model, kw):
    with pytest.raises(InvalidRequest):
        archrun.generate(model, [1, 2], **kw)


def test_prefix_cache_reuses_the_shared_prefix(model):
    from archrun.run.cache import PrefixCache

    pc = PrefixCache(model.init_cache())
    first = archrun.generate(model, [5, 9, 13, 2], max_tokens=4, temperature=0.0, cache=pc).complete()
    assert first.cached_tokens == 0
    assert len(pc.cache) == len(pc.ids) == 4 + max(0, first.completion_tokens - 1)
    prompt = [5, 9, 13, 2, *first.token_ids, 7, 8]
    again = archrun.generate(model, prompt, max_tokens=4, temperature=0.0, cache=pc).complete()
    assert again.cached_tokens == 4 + max(0, first.completion_tokens - 1)
    fresh = archrun.generate(model, prompt, max_tokens=4, temperature=0.0).complete()
    assert again.token_ids == fresh.token_ids and fresh.cached_tokens == 0
    same = archrun.generate(model, prompt, max_tokens=4, temperature=0.0, cache=pc).complete()
    assert same.cached_tokens == len(prompt) - 1 and same.token_ids == fresh.token_ids


def test_logprobs_are_the_models_log_softmax(model):
    r = archrun.generate(model, [5, 9], max_tokens=3, temperature=0.0, logprobs=3).complete()
    cache = model.init_cache()
    logits = model.forward_step([5, 9], cache).astype(np.float64)
    lsm = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    first = r.logprobs[0]
    assert first.token == r.token_ids[0] == int(np.argmax(lsm))
    assert abs(first.logprob - lsm[first.token]) < 1e-6
    assert [t for t, _ in first.top] == list(np.argsort(-lsm, kind="stable")[:3])
    assert len(r.logprobs) == r.completion_tokens


def test_bytes_are_not_a_prompt(model):
    with pytest.raises(InvalidRequest, match="bytes"):
        archrun.generate(model, b"hi")
