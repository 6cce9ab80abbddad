"""The op-by-op kernels (archrun_blocks.elementwise) and the reference ops (archrun_blocks.reference)
against hand-derived float64 formulas written here: RMSNorm, LayerNorm, rotary embedding,
causal attention (window, softcap), the activations (SiLU, tanh-GELU, exact GELU via math.erf,
squared ReLU) and the residual topologies. archrun's conformance kit (conftest.py) ties every fast op
to its reference; this file ties both to the math.

(The elementwise tests moved here from the core's tests/kernels/test_kernels.py with the kernels.)
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.errors import ShapeMismatch
from archrun.kernels.decode.parts import part
from archrun_blocks import elementwise, fast, parts, reference

SMALL = numba.config.DISABLE_JIT  # pure-Python kernels: keep sizes tiny
F32 = np.float32
EPS = 1e-6
_P_EPS = np.array([EPS, 0.0])  # a norm part's parameters: eps, weight offset
_P_NONE = np.zeros(1)


def _rms64(x, w, b=None):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + EPS) * w
    return y if b is None else y + b


def _layer64(x, w, b=None):
    """(x - mean) / sqrt(mean((x - mean)^2) + eps) * w + b: biased variance, as torch.nn.LayerNorm."""
    x = x.astype(np.float64)
    n = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True) / n
    var = ((x - mean) ** 2).sum(axis=-1, keepdims=True) / n
    y = (x - mean) / np.sqrt(var + EPS) * w
    return y if b is None else y + b


# -- norms -------------------------------------------------------------------------------------------


def test_rms_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 96), np.float32) * 3
    w = rng.standard_normal(96, np.float32)
    np.testing.assert_allclose(elementwise.norm_rows(part(parts.rms_norm).handle, _P_EPS, x, w, None), _rms64(x, w),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reference.rms_norm(EPS)(x, w), _rms64(x, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeMismatch):
        elementwise.norm_rows(part(parts.rms_norm).handle, _P_EPS, x, w[:10], None)


def test_unit_offset_norms_scale_by_one_plus_w():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 33)) * 2 + 1).astype(F32)
    w, b = rng.standard_normal(33).astype(F32), rng.standard_normal(33).astype(F32)
    tol = dict(rtol=1e-5, atol=1e-5)
    for ref, fst, want in ((reference.rms_norm_1p, fast.rms_norm_1p, _rms64(x, w + 1)),
                           (reference.layer_norm_1p, fast.layer_norm_1p, _layer64(x, w + 1, b))):
        bias = None if ref is reference.rms_norm_1p else b
        np.testing.assert_allclose(ref(EPS)(x, w, bias), want, **tol)
        np.testing.assert_allclose(fst(EPS)(x, w, bias), want, **tol)


@pytest.mark.parametrize("d", [1, 2, 7, 96, 577])
def test_layer_norm(d):
    """Offset inputs (mean 5, std 0.5): a formula that forgets to centre, or centres in float32
    sloppily, is off by far more than the tolerance."""
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((4, d)) * 0.5 + 5.0).astype(F32)
    w, b = rng.standard_normal(d).astype(F32), rng.standard_normal(d).astype(F32)
    want = _layer64(x, w, b)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reference.layer_norm(EPS)(x, w, b), want, **tol)
    np.testing.assert_allclose(elementwise.norm_rows(part(parts.layer_norm).handle, _P_EPS, x, w, b), want, **tol)
    np.testing.assert_allclose(fast.layer_norm(EPS)(x, w, b), want, **tol)
    np.testing.assert_allclose(reference.layer_norm(EPS)(x, w), _layer64(x, w), **tol)  # bias optional
    if d > 1:  # unit weight, no bias: zero mean and unit variance per row
        y = reference.layer_norm(EPS)(x, np.ones(d, F32)).astype(np.float64)
        np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-5)
        np.testing.assert_allclose(y.var(axis=-1), 1, rtol=1e-3)
    with pytest.raises(ShapeMismatch):
        elementwise.norm_rows(part(parts.layer_norm).handle, _P_EPS, x, w, b[:1] if d > 1 else np.zeros(2, F32))


# -- rope --------------------------------------------------------------------------------------------


def _rope_ref(x, cos, sin, n_rot, neox):
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    for i in range(half):
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
        c, s = cos[:, None, i], sin[:, None, i]
        out[..., a] = x[..., a] * c - x[..., b] * s
        out[..., b] = x[..., b] * c + x[..., a] * s
    return out


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [64, 32])
def test_rope(neox, n_rot):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 64), np.float32)
    ang = rng.uniform(0, 100, (3, n_rot // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    got = elementwise.rope(x, cos, sin, n_rot, neox)
    np.testing.assert_allclose(got, _rope_ref(x, cos, sin, n_rot, neox), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[..., n_rot:], x[..., n_rot:])
    with pytest.raises(ShapeMismatch):
        elementwise.rope(x, cos[:, :3], sin[:, :3], n_rot, neox)


# -- attention ---------------------------------------------------------------------------------------


def _attention_ref(q, k, v, q_pos, k_pos, scale, window, softcap=0.0):
    """softmax over the visible keys of softcap * tanh(q.k * scale / softcap) (or q.k * scale), times v."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    out = np.zeros((n, n_head, v.shape[2]))
    for i in range(n):
        vis = (k_pos <= q_pos[i]) & ((window == 0) | (k_pos > q_pos[i] - window))
        for h in range(n_head):
            s = (k[vis, h // group].astype(np.float64) @ q[i, h]) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[vis, h // group]
    return out


@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize(("n_head", "n_kv", "window", "n"), [(4, 2, 0, 3), (6, 1, 5, 4), (2, 2, 0, 1)])
def test_attention(n_head, n_kv, window, n, softcap):
    rng = np.random.default_rng(n_head * 10 + n_kv)
    n_t = 11
    q = rng.standard_normal((n, n_head, 16), np.float32) * 2
    k = rng.standard_normal((n_t, n_kv, 16), np.float32)
    v = rng.standard_normal((n_t, n_kv, 8), np.float32)
    k_pos = rng.permutation(n_t).astype(np.int64)  # e.g. a ring buffer: positions in any order
    q_pos = np.arange(n_t - n, n_t, dtype=np.int64)
    ref = _attention_ref(q, k, v, q_pos, k_pos, 0.25, window, softcap)
    got = elementwise.attention(q, k, v, q_pos, k_pos, 0.25, window, softcap)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reference.attend(q, k, v, q_pos, k_pos, 0.25, window, softcap), ref,
                               rtol=1e-5, atol=1e-5)


def test_attention_softcap_changes_the_result_as_the_formula_says():
    """A cap small against the scores flattens them: the capped result differs from the uncapped one,
    and both equal their formula (so the cap is really applied, before the softmax)."""
    spec = AttentionSpec(kind="causal", n_head=2, n_head_kv=1, head_dim=8, v_head_dim=8, scale=1.0, softcap=0.5)
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((5, h, 8)).astype(F32) * 3 for h in (2, 1, 1))
    pos = np.arange(5)
    for op in (reference.CausalAttention(spec), fast.causal_attention(spec)):
        got = op(q, k, v, op.new_slot(8), 0)
        np.testing.assert_allclose(got, _attention_ref(q, k, v, pos, pos, 1.0, 0, 0.5), rtol=1e-5, atol=1e-5)
        assert np.abs(got - _attention_ref(q, k, v, pos, pos, 1.0, 0)).max() > 0.1


def test_attention_parallel_path_matches():
    rng = np.random.default_rng(2)
    n_t = 8 if SMALL else 300
    q = rng.standard_normal((4, 8, 64), np.float32)
    k = rng.standard_normal((n_t, 2, 64), np.float32)
    v = rng.standard_normal((n_t, 2, 64), np.float32)
    q_pos = np.arange(n_t - 4, n_t, dtype=np.int64)
    k_pos = np.arange(n_t, dtype=np.int64)
    got = elementwise.attention(q, k, v, q_pos, k_pos, 0.125, 0)
    np.testing.assert_allclose(got, _attention_ref(q, k, v, q_pos, k_pos, 0.125, 0), rtol=1e-5, atol=1e-5)


def test_attention_bad_shapes():
    q = np.zeros((1, 3, 8), np.float32)
    k = np.zeros((2, 2, 8), np.float32)
    pos = np.zeros(1, np.int64), np.zeros(2, np.int64)
    with pytest.raises(ShapeMismatch):
        elementwise.attention(q, k, k, *pos, 1.0, 0)  # 3 heads over 2 kv heads
    with pytest.raises(ShapeMismatch):
        elementwise.attention(q[:, :2], k, k, pos[0].astype(np.int32), pos[1], 1.0, 0)
    with pytest.raises(ShapeMismatch):
        elementwise.attention(q[:, :2], k, k[:1], *pos, 1.0, 0)


# -- activations -------------------------------------------------------------------------------------

_ERF = np.vectorize(math.erf)
FORMULAS = {
    "silu": lambda g: g / (1 + np.exp(-g)),
    "gelu_tanh": lambda g: 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))),
    "gelu": lambda g: 0.5 * g * (1 + _ERF(g / math.sqrt(2))),
    "relu2": lambda g: np.maximum(g, 0) ** 2,
}


@pytest.mark.parametrize("kind", list(FORMULAS))
def test_activations(kind):
    rng = np.random.default_rng(4)
    gate = (rng.standard_normal((3, 50)) * 4).astype(np.float32)
    up = rng.standard_normal((3, 50), np.float32)
    want = FORMULAS[kind](gate.astype(np.float64))
    fn = part(getattr(parts, kind)).handle  # what fast ops pass: a typed list [(fn,)] built once
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(elementwise.activation(fn, _P_NONE, gate, up), want * up, **tol)
    np.testing.assert_allclose(elementwise.activation(fn, _P_NONE, gate), want, **tol)
    np.testing.assert_allclose(getattr(reference, kind)()(gate, up), want * up, **tol)
    np.testing.assert_allclose(getattr(reference, kind)()(gate), want, **tol)
    with pytest.raises(ShapeMismatch):
        elementwise.activation(fn, _P_NONE, gate, up[:, :10])
    with pytest.raises(ShapeMismatch):
        elementwise.activation(fn, _P_NONE, gate.astype(np.float64), up)
    with pytest.raises(TypeError, match="Part.handle"):  # a bare function would compile a kernel of its own,
        elementwise.activation(getattr(parts, kind), _P_NONE, gate, up)  # a (fn,) tuple cost ~0.1 ms to convert
    with pytest.raises(TypeError, match="Part.handle"):
        elementwise.activation((getattr(parts, kind),), _P_NONE, gate, up)


def test_activation_reads_column_slices_in_place_and_takes_any_shape():
    """gate/up as column slices of one fused [n, 2m] product (read in place, row by row), a transposed view, a
    3-D array and a 1-D one: the formula's values each time, and the inputs unchanged."""
    rng = np.random.default_rng(5)
    fused = rng.standard_normal((4, 2 * 37), np.float32) * 3
    kept = fused.copy()
    gate, up = fused[:, :37], fused[:, 37:]
    fn = part(parts.silu).handle
    tol = dict(rtol=1e-5, atol=1e-5)
    want = FORMULAS["silu"](gate.astype(np.float64)) * up
    np.testing.assert_allclose(elementwise.activation(fn, _P_NONE, gate, up), want, **tol)
    np.testing.assert_allclose(elementwise.activation(fn, _P_NONE, gate.T, up.T), want.T, **tol)
    cube = fused.reshape(2, 2, 74)
    np.testing.assert_allclose(elementwise.activation(fn, _P_NONE, cube), FORMULAS["silu"](cube.astype(np.float64)),
                               **tol)
    np.testing.assert_allclose(elementwise.activation(fn, _P_NONE, fused[1]), FORMULAS["silu"](kept[1].astype(
        np.float64)), **tol)
    assert np.array_equal(fused, kept)


def test_gelu_differs_from_its_tanh_approximation():
    """Exact GELU and tanh-GELU are different ops: their gap is ~1e-4..1e-3 near |x| ~ 2, far above
    the tolerance their tests use."""
    g = np.linspace(-4, 4, 81).astype(F32)
    gap = np.abs(reference.gelu()(g) - reference.gelu_tanh()(g)).max()
    assert 1e-4 < gap < 1e-2


def test_relu2_values():
    g = np.array([-2.0, -0.0, 0.0, 0.5, 3.0], F32)
    np.testing.assert_array_equal(reference.relu2()(g), [0.0, 0.0, 0.0, 0.25, 9.0])
    np.testing.assert_array_equal(fast.relu2()(g), [0.0, 0.0, 0.0, 0.25, 9.0])


# -- residual topologies -----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_residual_formulas(scale):
    """sequential: g = x + s a, out = g + s f; parallel: g = x, out = x + s (a + f)."""
    rng = np.random.default_rng(5)
    x, a, f = (rng.standard_normal((3, 40)).astype(F32) for _ in range(3))
    x64, a64, f64 = (t.astype(np.float64) for t in (x, a, f))
    tol = dict(rtol=1e-6, atol=1e-6)
    for make in (reference.Sequential, fast.sequential):
        op = make(scale)
        np.testing.assert_allclose(op.ffn_input(x, a), x64 + scale * a64, **tol)
        np.testing.assert_allclose(op.combine(x, a, f), x64 + scale * a64 + scale * f64, **tol)
    for make in (reference.Parallel, fast.parallel):
        op = make(scale)
        np.testing.assert_array_equal(op.ffn_input(x, a), x)
        np.testing.assert_allclose(op.combine(x, a, f), x64 + scale * (a64 + f64), **tol)
