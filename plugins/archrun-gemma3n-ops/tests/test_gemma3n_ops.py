"""archrun-gemma3n-ops against hand-written float64 math: the sparse gate's Gaussian cut (HF's population
deviation, the 0.95 quantile), LAuReL's residual, and AltUp's predict / correct / per-layer input / merge
written out stream by stream as HF's permuted matmuls compute them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from archrun_blocks import reference
from archrun_gemma3n_ops.altup import Altup
from archrun_gemma3n_ops.laurel import Laurel
from archrun_gemma3n_ops.sparsity import gaussian_cut, gelu_tanh_sparse

RNG = np.random.default_rng(3)
F32 = np.float32
EPS = 1e-6
Z95 = 1.6448536269514722  # the standard normal quantile of 0.95


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(F32)


def rms(x, w=1.0):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def test_gaussian_cut_keeps_the_top_of_each_row():
    g = rnd(3, 400, scale=2.0)
    want = np.maximum(g - (g.mean(-1, keepdims=True) + g.std(-1, keepdims=True) * Z95), 0)  # population std
    np.testing.assert_allclose(gaussian_cut(g, Z95), want, rtol=1e-5, atol=1e-5)
    kept = (gaussian_cut(g, Z95) > 0).mean()
    assert 0.02 < kept < 0.09  # ~5% of a Gaussian row survives the 0.95 cut


def test_sparse_and_dense_layers():
    g, u = rnd(2, 64), rnd(2, 64)
    cut = np.maximum(g - (g.mean(-1, keepdims=True) + g.std(-1, keepdims=True) * Z95), 0)
    np.testing.assert_allclose(gelu_tanh_sparse(1.0, Z95)(g, u), gelu(cut) * u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gelu_tanh_sparse(0.0, 0.0)(g, u), gelu(g.astype(np.float64)) * u, rtol=1e-5,
                               atol=1e-6)


class _Binder:
    """What the ops bind: named tensors, rms norms, products as numpy."""

    def __init__(self, tensors, n_embd):
        self.t = tensors
        self.d = SimpleNamespace(norm="rms", norm_eps=EPS, n_embd=n_embd)

    def op(self, slot, name, *args):
        return {"norm": lambda: reference.rms_norm(EPS), "activation": reference.gelu_tanh}[slot]()

    def matrix(self, role, layer=None, lazy=False):
        w = self._get(role, layer)
        def m(x):
            return np.asarray(x, F32) @ w.T

        m.rows = lambda ids: w[ids]
        return m

    def _get(self, role, layer):
        return self.t[role if layer is None else f"{layer}.{role}"]

    vector = table = norm_weight = lambda self, role, layer=None: self._get(role, layer)


def test_laurel_residual():
    d, r = 12, 3
    t = {"0.attn_norm": rnd(d), "0.laurel_l": rnd(r, d), "0.laurel_r": rnd(d, r), "0.laurel_post_norm": rnd(d)}
    res = Laurel(1.0)
    res.bind(_Binder(t, d), 0)
    x, a, f = rnd(4, d), rnd(4, d), rnd(4, d)
    h = rms(x, t["0.attn_norm"])
    laurel = h + rms(h @ t["0.laurel_l"].T @ t["0.laurel_r"].T, t["0.laurel_post_norm"])
    g = (x + a + laurel) / math.sqrt(2)
    np.testing.assert_allclose(res.ffn_input(x, a), g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.combine(x, a, f), g + f, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.combine(x + 1, a, f), res.ffn_input(x + 1, a) + f, rtol=1e-6)  # no stale g


def _altup_tensors(d, s, p, n_layer, vocab):
    t = {"altup_proj": rnd(s - 1, d, d, scale=d ** -0.5), "altup_unembd_proj": rnd(s - 1, d, d, scale=d ** -0.5),
         "per_layer_token_embd": rnd(vocab, n_layer * p), "per_layer_model_proj": rnd(n_layer * p, d, scale=0.3),
         "per_layer_proj_norm": rnd(p) + 1}
    for i in range(n_layer):
        t.update({f"{i}.altup_router_norm": rnd(d) + 1, f"{i}.altup_router": rnd(s, d, scale=3.0),
                  f"{i}.altup_predict_coef": rnd(s * s, s, scale=0.5), f"{i}.altup_correct_coef": rnd(s, s),
                  f"{i}.altup_correct_scale": rnd(d) + 1, f"{i}.inp_gate": rnd(p, d, scale=0.5),
                  f"{i}.proj": rnd(d, p), f"{i}.post_norm": rnd(d) + 1})
    return t


def _hf_altup(t, x, ids, blocks, s, active, p):
    """HF Gemma3nTextModel's stream arithmetic in float64, stream by stream."""
    x = np.asarray(x, np.float64)
    n, d = x.shape
    n_layer = len(blocks)
    mag = lambda v: np.sqrt(np.mean(v * v, -1, keepdims=True))  # noqa: E731
    proj = rms((x @ t["per_layer_model_proj"].T / math.sqrt(d)).reshape(n, n_layer, p), t["per_layer_proj_norm"])
    inputs = (proj + t["per_layer_token_embd"][ids].reshape(n, n_layer, p) * math.sqrt(p)) / math.sqrt(2)
    xs = [x] + [(y := x @ t["altup_proj"][k].T) * mag(x) / np.sqrt(np.maximum(np.mean(y * y, -1, keepdims=True),
                                                                             1e-5)) for k in range(s - 1)]
    for i, block in enumerate(blocks):
        def route(v, i=i):
            return np.tanh(rms(v, t[f"{i}.altup_router_norm"]) / d @ t[f"{i}.altup_router"].T)
        raw = (route(xs[active]) @ t[f"{i}.altup_predict_coef"].T).reshape(n, s, s)
        pred = [xs[j] + sum(raw[:, j, k, None] * xs[k] for k in range(s)) for j in range(s)]
        out = np.asarray(block(pred[active].astype(F32)), np.float64)
        gains = route(out) @ t[f"{i}.altup_correct_coef"].T + 1
        xs = [pred[j] + gains[:, j, None] * (out - pred[active]) for j in range(s)]
        first = xs[active] * t[f"{i}.altup_correct_scale"]
        y = gelu(first @ t[f"{i}.inp_gate"].T) * inputs[:, i]
        y = rms(y @ t[f"{i}.proj"].T, t[f"{i}.post_norm"])
        xs = [xs[0]] + [v + y for v in xs[1:]]
    merged = [xs[0]] + [(u := xs[k] @ t["altup_unembd_proj"][k - 1].T) * mag(xs[0])
                        / np.sqrt(np.maximum(np.mean(u * u, -1, keepdims=True), 1e-5)) for k in range(1, s)]
    return np.mean(merged, axis=0)


@pytest.mark.parametrize("active", [0, 2])
def test_altup_streams_match_hf_arithmetic(active):
    d, s, p, n_layer, vocab, n = 16, 4, 3, 3, 11, 5
    t = _altup_tensors(d, s, p, n_layer, vocab)
    op = Altup(SimpleNamespace(n_embd=d, n_layer=n_layer), s, active, p)
    op.bind(_Binder(t, d))
    weights = [rnd(d, d, scale=d ** -0.5) for _ in range(n_layer)]
    blocks = [lambda h, w=w: np.tanh(np.asarray(h, F32) @ w.T) * 3 + h for w in weights]  # any [n, d] map
    x, ids = rnd(n, d, scale=2.0), RNG.integers(0, vocab, n)
    state = op.enter(x, ids)
    for i, block in enumerate(blocks):
        state = op.layer(i, state, block)
    got = op.leave(state)
    want = _hf_altup(t, x, ids, blocks, s, active, p)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
