"""xIELU (activation=xielu) against its formula in float64 (HF XIELUActivation / llama.cpp
ggml_xielu: a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n), x > 0: a_p x^2 + beta x, else
(expm1(min(x, eps)) - x) a_n + beta x) and against HF's module itself: the reference op, the fast op
and its kernel part, on raw parameters as files store them."""

import math

import numpy as np
import pytest

from archrun_blocks import xielu
from archrun_blocks.xielu_part import xielu_fast

F32 = np.float32
PARAMS = [  # raw (alpha_n, alpha_p, beta, eps)
    dict(xielu.INIT),
    dict(alpha_n=-1.3, alpha_p=0.9, beta=0.35, eps=-1e-6),
    dict(alpha_n=0.7, alpha_p=-2.0, beta=0.8, eps=-0.5),  # a wide eps: the clamp bites below -0.5
    dict(alpha_n=25.0, alpha_p=21.0, beta=0.5, eps=-1e-6),  # softplus's linear branch (> 20)
]
X = np.concatenate([np.linspace(-12, 6, 181), [-1e-7, -2e-6, 0.0, 1e-7, -0.5, -0.49]]).astype(F32)


def formula(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    def sp(v):
        return v if v > 20 else math.log1p(math.exp(v))

    x = x.astype(np.float64)
    a_p, a_n = sp(alpha_p), beta + sp(alpha_n)
    return np.where(x > 0, a_p * x * x + beta * x, (np.expm1(np.minimum(x, eps)) - x) * a_n + beta * x)


@pytest.mark.parametrize("params", PARAMS, ids=range(len(PARAMS)))
def test_ops_follow_the_formula(params):
    want = formula(X, **params)
    tol = 2e-6 * np.abs(want).max()
    ref, fast = xielu.xielu(**params), xielu_fast(**params)
    assert np.abs(ref(X) - want).max() <= tol
    assert np.abs(fast(X) - want).max() <= tol
    up = np.linspace(-2, 2, X.size).astype(F32)
    assert np.abs(fast(X, up) - want * up).max() <= 2 * tol  # gated: xielu(x) * up
    out = np.empty_like(X)
    fast.fused.fn(fast.fused.params, X.copy(), out)  # the kernel part of the fused decode path
    assert np.abs(out - want).max() <= tol


def test_raw_parameters_pass_through_softplus():
    # a_p = softplus(alpha_p): a raw alpha_p of 0 gives a_p = ln 2, not 0
    act = xielu.xielu(alpha_n=0.0, alpha_p=0.0, beta=0.0, eps=-1e-6)
    assert act(np.array([2.0], F32))[0] == pytest.approx(4 * math.log(2), rel=1e-6)


def test_matches_hf_xielu_activation():
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    module = activations.XIELUActivation(dtype=torch.float32)
    for params in PARAMS[1:3]:
        with torch.no_grad():
            module.alpha_n.fill_(params["alpha_n"])
            module.alpha_p.fill_(params["alpha_p"])
            module.beta.fill_(params["beta"])
            module.eps.fill_(params["eps"])
            want = module._xielu_python(torch.from_numpy(X)).numpy()
        got = xielu_fast(**params)(X)
        assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()
