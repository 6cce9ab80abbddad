"""The multi-row fused kernel (kernels.decode.layer.decode_rows) behind forward_step_batch(_spans): every row of a
batch of sequences, and every position of a span of one sequence, gives the same logits, bit for bit, as
one-token forward_step calls on the same cache; and so greedy speculative decoding equals plain greedy
decoding exactly on quantized real models.

The reference is archrun's own one-token fused step (itself checked against llama.cpp and HF transformers
by tests/run/test_real_models.py and the family tests): the property under test is exact agreement between two
paths, not a numeric bound. Each real model covers a different mix: SmolLM2 (Q4_1), Gemma 3 (Q4_K_M with
Q6_K/Q5_0 layers, sliding-window rings, q/k norms, post norms, a softcap-free tied head), Qwen2.5 (Q4_K_M with
Q6_K layers, q/k/v biases).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.models import real_model

import archrun
from archrun.generation import speculative
from archrun.kernels.decode.fusion import ROWS_MAX
from archrun.kernels.matmul import qmatrix

MODELS = ["smollm2", "gemma3", "qwen25"]
TEXTS = ("The cat sat on the mat and", "In 1492, Columbus sailed", "def fib(n):\n    return", "Hello",
         "Rivers flow to the sea because")


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return archrun.load(real_model(request.param))


@pytest.fixture(params=[2, 1], ids=["2threads", "1thread"])
def threads(request):
    """Both the decode pool's shared products (2 threads) and one thread."""
    before = qmatrix.current_threads()
    if request.param > before:
        pytest.skip("one core")
    qmatrix.set_threads(request.param)
    yield request.param
    qmatrix.set_threads(before)


def prefilled(model, prompts, capacity=256, **kw):
    """Two caches per prompt with the same prompt prefilled (the same path, so the same bits)."""
    solo, together = [], []
    for p in prompts:
        for caches in (solo, together):
            caches.append(model.init_cache(capacity, **kw))
            model.forward_step(p, caches[-1])
    return solo, together


def test_the_rows_kernel_runs(model):
    assert model._decode.rows_ready  # dense fused layers: the batch takes decode_rows, not the op-by-op path


def test_a_batch_of_sequences_equals_one_token_steps_bitwise(model, threads):
    tok = model.tokenizer
    prompts = [tok.encode(t) for t in TEXTS]                      # different lengths: different positions
    solo, together = prefilled(model, prompts)
    nxt = [[p[-1]] for p in prompts]
    for _ in range(3):
        want = np.stack([model.forward_step(t, c) for t, c in zip(nxt, solo, strict=True)])
        got = np.stack(model.forward_step_batch(nxt, together))
        np.testing.assert_array_equal(got, want)
        nxt = [[int(i)] for i in want.argmax(1)]
    assert [len(c) for c in together] == [len(c) for c in solo]


@pytest.mark.parametrize("k", [2, 5, 17])
def test_a_span_equals_one_token_steps_bitwise_at_every_position(model, k, threads):
    prompt = model.tokenizer.encode(TEXTS[0])
    (solo,), (together,) = prefilled(model, [prompt])
    span = [int(t) for t in (np.arange(k) * 37 + 100) % 5000]
    want = np.stack([model.forward_step([t], solo) for t in span])
    (got,) = model.forward_step_batch_spans([span], [together], all_logits=True)
    np.testing.assert_array_equal(got, want)
    # and the next one-token step reads the span's K/V: the same bits too
    np.testing.assert_array_equal(model.forward_step([7], together), model.forward_step([7], solo))


def test_spans_and_single_tokens_of_several_sequences_in_one_pass(model):
    tok = model.tokenizer
    prompts = [tok.encode(t) for t in TEXTS[:4]]
    solo, together = prefilled(model, prompts)
    spans = [[11, 12, 13], [14], [15, 16, 17, 18, 19, 20], [21]]
    want = [np.stack([model.forward_step([t], c) for t in s]) for s, c in zip(spans, solo, strict=True)]
    got = model.forward_step_batch_spans(spans, together, all_logits=True)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)


def test_more_rows_than_one_pass_are_cut_into_passes(model):
    prompts = [[1 + i, 2 + i] for i in range(3)]
    solo, together = prefilled(model, prompts, capacity=64)
    spans = [[5 + i] * (ROWS_MAX // 2 + 3) for i in range(3)]      # 57 rows: two passes
    want = [np.stack([model.forward_step([t], c) for t in s]) for s, c in zip(spans, solo, strict=True)]
    got = model.forward_step_batch_spans(spans, together, all_logits=True)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)


def test_spans_across_the_sliding_window_ring_boundary():
    model = archrun.load(real_model("gemma3"))
    window = max(ls.attention.window for ls in model.descriptor.layers)
    assert window > 0
    ids = [int(t) for t in (np.arange(window + 40) * 13 + 7) % 4000]
    # rings of window + 2 rows: the spans' rows wrap around the ring, and write over rows an earlier
    # row of the same span could still see if they ran out of order
    solo, together = prefilled(model, [ids[:window - 3]], capacity=window + 64, max_rewind=2)
    for a, b in ((window - 3, window + 4), (window + 4, window + 21)):
        want = np.stack([model.forward_step([t], solo[0]) for t in ids[a:b]])
        (got,) = model.forward_step_batch_spans([ids[a:b]], together, all_logits=True)
        np.testing.assert_array_equal(got, want)


def test_long_spans_keep_the_prefill_path(model):
    """A span longer than ROWS_MAX (a prompt chunk) takes the prefill's GEMM, as forward_step does."""
    ids = [int(t) for t in (np.arange(ROWS_MAX + 5) * 31 + 3) % 5000]
    a, b = model.init_cache(64), model.init_cache(64)
    (got,) = model.forward_step_batch_spans([ids], [a], all_logits=True)
    np.testing.assert_array_equal(got, model.forward_step(ids, b, all_logits=True))


# -- speculative decoding: greedy output equals plain greedy decoding exactly --------------------------


CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_greedy_speculation_equals_plain_greedy_on_quantized_models(model, drafter):
    prompt = model.tokenizer.encode(CODE * 2)
    plain = archrun.generate(model, prompt, max_tokens=48, temperature=0.0).complete()
    # lookup drafts are often rejected (rewinds); the model drafting for itself proposes its own one-token
    # greedy choices, which a verification step computing each row exactly as that step must all accept
    d = speculative.LookupDrafter() if drafter == "lookup" else speculative.ModelDrafter(model, model)
    spec = speculative.generate(model, prompt, d, max_tokens=48, temperature=0.0, draft_max=8).complete()
    assert spec.token_ids == plain.token_ids
    assert spec.timings["spec_drafted"] > 0
    if drafter == "draft":
        assert spec.timings["spec_acceptance"] == 1.0
