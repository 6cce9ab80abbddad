"""Sampling: validation, greedy equivalences, seeded reproducibility, statistical top-p/min-p checks."""

import math

import numpy as np
import pytest

from archrun.errors import InvalidRequest
from archrun.generation.sampling import Sampler, SamplingParams

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))  # a known distribution


def draws(n=4000, **kw):
    s = Sampler(SamplingParams(**kw), len(LOGITS))
    return np.bincount([s(LOGITS) for _ in range(n)], minlength=len(LOGITS)) / n


def test_temperature_zero_and_top_k_one_are_greedy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal(50)
        assert Sampler(SamplingParams(temperature=0.0), 50)(x) == np.argmax(x)
        assert Sampler(SamplingParams(top_k=1, seed=3), 50)(x) == np.argmax(x)


def test_same_seed_same_tokens_different_seed_differs():
    x = np.random.default_rng(1).standard_normal(1000)
    params = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = [Sampler(SamplingParams(seed=7, **params), 1000)(x) for _ in range(1)]
    s1, s2, s3 = (Sampler(SamplingParams(seed=s, **params), 1000) for s in (7, 7, 8))
    seq1, seq2, seq3 = ([s(x) for _ in range(30)] for s in (s1, s2, s3))
    assert seq1 == seq2 and seq1 != seq3 and a[0] == seq1[0]


def test_plain_sampling_follows_the_distribution():
    freq = draws(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    np.testing.assert_allclose(freq, np.exp(LOGITS), atol=0.03)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # cumulative: 0.5, 0.7, 0.85 -> top_p=0.7 keeps {0, 1} with renormalised 5/7, 2/7
    freq = draws(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=1)
    assert freq[2:].sum() == 0
    np.testing.assert_allclose(freq[:2], [5 / 7, 2 / 7], atol=0.03)


def test_min_p_drops_tokens_below_fraction_of_best():
    # min_p=0.25: threshold 0.125 keeps {0.5, 0.2, 0.15}
    freq = draws(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25, seed=2)
    assert freq[3:].sum() == 0
    np.testing.assert_allclose(freq[:3], np.array([0.5, 0.2, 0.15]) / 0.85, atol=0.03)


def test_top_k_restricts_support():
    freq = draws(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=3)
    assert freq[2:].sum() == 0


def test_low_temperature_sharpens():
    hot = draws(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=4)
    cold = draws(temperature=0.3, top_k=0, top_p=1.0, min_p=0.0, seed=4)
    assert cold[0] > 0.9 > hot[0]


def test_logit_bias_and_penalties():
    x = np.zeros(10)
    assert Sampler(SamplingParams(temperature=0, logit_bias={7: 5.0}), 10)(x) == 7
    x = np.array([3.0, 2.9, 0.0])
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=1.2), 3)
    assert s(x, history=[0]) == 1  # 3.0 / 1.2 = 2.5 < 2.9
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.5), 3)
    assert s(x, history=[0, 0]) == 1
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.05), 3)
    assert s(x, history=[0]) == 0 and s(x, history=[0, 0, 0]) == 1


@pytest.mark.parametrize("kw", [
    {"temperature": math.nan}, {"temperature": -1.0}, {"temperature": math.inf}, {"top_p": 0.0},
    {"top_p": 1.5}, {"min_p": -0.1}, {"top_k": -1}, {"top_k": 2.5}, {"repetition_penalty": 0.0},
    {"seed": -3}, {"seed": "x"}, {"temperature": "hot"}, {"temperature": True},
])
def test_out_of_range_options_are_invalid_requests(kw):
    with pytest.raises(InvalidRequest):
        SamplingParams(**kw)


@pytest.mark.parametrize("bias", [{10: 1.0}, {-1: 1.0}, {"x": 1.0}, {1: math.nan}])
def test_logit_bias_outside_vocab(bias):
    with pytest.raises(InvalidRequest):
        Sampler(SamplingParams(logit_bias=bias), 10)
