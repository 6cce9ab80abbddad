"""MoE routing on hand-built scores whose selection and weights are known analytically."""

import numpy as np
import pytest

from archrun.descriptor import MoeSpec
from archrun_blocks.reference import gating_sigmoid, gating_softmax, route


def spec(**kw):
    base = dict(kind="topk", activation="silu", n_expert=8, n_expert_used=2, n_ff=4, gating="sigmoid",
                weights_norm=False)
    base.update(kw)
    return MoeSpec(**base)


def test_top_k_without_bias_picks_the_largest():
    probs = np.array([[0.1, 0.9, 0.3, 0.8, 0.2, 0.0, 0.4, 0.5]], np.float32)
    ids, w = route(probs, None, spec())
    assert ids.tolist() == [[1, 3]]
    np.testing.assert_allclose(w, [[0.9, 0.8]])


def test_bias_changes_selection_but_not_weights():
    probs = np.array([[0.1, 0.9, 0.3, 0.8, 0.2, 0.0, 0.4, 0.5]], np.float32)
    bias = np.array([0, 0, 0.7, 0, 0, 0, 0, 0], np.float32)   # expert 2: 0.3 + 0.7 = 1.0 beats 0.9
    ids, w = route(probs, bias, spec())
    assert ids.tolist() == [[2, 1]]
    np.testing.assert_allclose(w, [[0.3, 0.9]])              # unbiased probabilities


def test_group_limit_excludes_a_group():
    # 4 groups of 2; group scores (top-2 sums): g0 0.1+0.2, g1 0.9+0.0, g2 0.5+0.5, g3 0.45+0.4
    probs = np.array([[0.1, 0.2, 0.9, 0.0, 0.5, 0.5, 0.45, 0.4]], np.float32)
    ids, w = route(probs, None, spec(n_group=4, n_group_used=2, n_expert_used=3))
    # best groups: g2 (1.0) and g1 (0.9); g3's 0.45 is excluded although it beats 0.0
    assert sorted(ids[0].tolist()) == [2, 4, 5]


def test_renormalisation_and_scale():
    probs = np.array([[0.6, 0.2, 0.1, 0.1, 0, 0, 0, 0]], np.float32)
    ids, w = route(probs, None, spec(weights_norm=True, weights_scale=2.5))
    assert ids.tolist() == [[0, 1]]
    np.testing.assert_allclose(w, [[0.75 * 2.5, 0.25 * 2.5]], rtol=1e-6)


def test_renormalisation_floor():
    probs = np.zeros((1, 8), np.float32)
    probs[0, :2] = 1e-6
    _, w = route(probs, None, spec(weights_norm=True))
    np.testing.assert_allclose(w, [[1e-6 / 6.103515625e-5] * 2], rtol=1e-5)


@pytest.mark.parametrize("gating, expected", [
    (gating_softmax, np.exp([1.0, 2.0, 3.0]) / np.exp([1.0, 2.0, 3.0]).sum()),
    (gating_sigmoid, 1 / (1 + np.exp(-np.array([1.0, 2.0, 3.0])))),
])
def test_gating_functions(gating, expected):
    np.testing.assert_allclose(gating()(np.array([[1.0, 2.0, 3.0]], np.float32))[0], expected, rtol=1e-6)
