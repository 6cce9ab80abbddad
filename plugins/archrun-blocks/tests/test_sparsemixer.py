"""PhiMoE's sparsemixer gating: hand-derived weights, HF's own function, the kernel part."""

import numpy as np
import pytest

from archrun_blocks import parts
from archrun_blocks.reference import gating_sparsemixer


def test_hand_derived_weights():
    # best 3.0: within 2 x 0.01 relative gap only 2.99 -> softmax of (0, -0.01); second best 2.99
    # (expert 0 excluded): nothing else within 2 % of 2.99 -> weight 1; the others 0
    logits = np.array([[3.0, 2.99, 1.0, 2.5]], np.float32)
    w1 = 1.0 / (1.0 + np.exp(np.float32(2.99) - np.float32(3.0)))
    np.testing.assert_allclose(gating_sparsemixer()(logits)[0], [w1, 1.0, 0.0, 0.0], rtol=1e-6)


def test_negative_scores_and_eps():
    # best -1.0: factor max(|s|, -1) = |s|; (-1 - (-1.01)) / 1.01 < 0.02 keeps -1.01; -1.5 is 33 % off
    logits = np.array([[-1.5, -1.0, -1.01]], np.float32)
    probs = gating_sparsemixer()(logits)[0]
    np.testing.assert_allclose(probs[1], 1.0 / (1.0 + np.exp(np.float32(-1.01) + np.float32(1.0))), rtol=1e-6)
    assert probs[2] == pytest.approx(1.0) and probs[0] == 0.0
    wide = gating_sparsemixer(jitter_eps=0.5)(logits)[0]  # a 100 % gap keeps every expert
    e = np.exp(logits[0] - logits[0].max())
    assert wide[1] == pytest.approx(e[1] / e.sum(), rel=1e-6)


def _random_logits(seed, n=64, experts=16):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 0.05, (n, experts)).astype(np.float32)
    logits[: n // 2] += rng.normal(1.0, 0.01, (n // 2, 1)).astype(np.float32)  # near-ties that the gap keeps
    return logits


def test_kernel_part_matches_reference():
    ref = gating_sparsemixer()
    for seed in range(3):
        logits = _random_logits(seed)
        want = ref(logits)
        got = np.empty_like(want)
        for i in range(len(logits)):
            parts.gating_sparsemixer(np.array([0.01]), logits[i], got[i])
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-7)
        assert ((want > 0).sum(axis=1) == 2).all()


def test_matches_transformers_sparsemixer():
    torch = pytest.importorskip("torch")
    phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")
    logits = _random_logits(7)
    weights, ids = phimoe.sparsemixer(torch.from_numpy(logits), jitter_eps=0.01, training=False)
    want = np.zeros_like(logits)
    np.put_along_axis(want, ids.numpy(), weights.numpy(), axis=1)
    np.testing.assert_allclose(gating_sparsemixer()(logits), want, rtol=1e-6, atol=1e-7)
