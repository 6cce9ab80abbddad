"""The MoE kernels (archrun_blocks.moe_kernels) against the reference routing and mixture (archrun_blocks.reference).

Routing is compared exactly (selected ids, including ties, the group limit and the selection
bias); the mixture against reference.moe_topk on the same weights: with fast-backend matrices
(the op-by-op path, same 8-bit activation quantization: tight tolerance) and, for float32
weights, with reference-backend matrices (dense float32, an independent oracle).
"""

import gguf.quants
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from archrun.descriptor import MoeSpec
from archrun.errors import ShapeMismatch
from archrun.io.weights import Matrix, MoeWeights
from archrun.kernels.decode.parts import part
from archrun_blocks import fast, parts, reference
from archrun_blocks import moe_kernels as mk

F32 = np.float32
GATINGS = {"softmax": part(parts.gating_softmax).handle,  # the gating parts' handles, as the MoE op passes them
           "sigmoid": part(parts.gating_sigmoid).handle}
_NO_PARAMS = np.zeros(1)


def spec(**kw) -> MoeSpec:
    base = dict(kind="topk", activation="silu", n_expert=8, n_expert_used=2, n_ff=16, gating="softmax",
                weights_norm=False)
    base.update(kw)
    return MoeSpec(**base)


def rp(s: MoeSpec) -> tuple:
    return (s.n_expert_used, s.n_group, s.n_group_used, int(s.weights_norm))


def kernel_route(probs_or_logits, bias, s: MoeSpec, from_logits: bool):
    n, k = probs_or_logits.shape[0], s.n_expert_used
    ids, wts = np.empty((n, k), np.int64), np.empty((n, k), F32)
    pb = np.empty(0, F32) if bias is None else bias
    if from_logits:
        mk.route_rows(probs_or_logits, pb, rp(s), s.weights_scale, GATINGS[s.gating], _NO_PARAMS, ids, wts)
    else:
        for t in range(n):
            mk.choose(probs_or_logits[t], pb, rp(s), s.weights_scale, ids[t], wts[t])
    return ids, wts


ROUTINGS = [dict(), dict(weights_norm=True), dict(weights_scale=2.5), dict(weights_norm=True, weights_scale=1.5),
            dict(n_group=4, n_group_used=2, n_expert_used=3), dict(n_group=8, n_expert=16, n_group_used=3,
                                                                    n_expert_used=4, weights_norm=True),
            dict(n_group=4, n_group_used=1, n_expert_used=1), dict(n_expert_used=8)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kw", ROUTINGS)
def test_selection_with_ties_matches_reference(kw, bias):
    """Scores on a 1/8 grid tie often (their sums too, exactly): the kernel keeps the reference's
    order (its stable argsort: lower expert index first)."""
    s = spec(**kw)
    rng = np.random.default_rng(len(str(kw)) + bias)
    probs = (rng.integers(0, 9, (200, s.n_expert)) / 8).astype(F32)
    b = (rng.integers(-4, 5, s.n_expert) / 16).astype(F32) if bias else None
    ids, wts = kernel_route(probs, b, s, from_logits=False)
    ref_ids, ref_w = reference.route(probs, b, s)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(wts, ref_w, rtol=1e-6)


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kw", ROUTINGS)
def test_routing_from_logits_matches_reference(kw, bias, gating):
    s = spec(gating=gating, **kw)
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((100, s.n_expert)) * 2).astype(F32)
    b = (rng.standard_normal(s.n_expert) * 0.3).astype(F32) if bias else None
    ids, wts = kernel_route(logits, b, s, from_logits=True)
    ref_ids, ref_w = reference.route(getattr(reference, f"gating_{gating}")()(logits), b, s)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(wts, ref_w, rtol=2e-6, atol=1e-7)


def test_more_experts_than_the_kept_groups_hold():
    """k beyond the kept groups' experts: the reference ranks the rest as -inf, lowest index first."""
    s = spec(n_group=4, n_group_used=1, n_expert_used=4)
    probs = np.array([[0.1, 0.2, 0.9, 0.8, 0.3, 0.4, 0.5, 0.6]], F32)
    ids, _ = kernel_route(probs, None, s, from_logits=False)
    assert ids.tolist() == reference.route(probs, None, s)[0].tolist() == [[2, 3, 0, 1]]


def test_renormalisation_floor():
    s = spec(weights_norm=True)
    probs = np.zeros((1, 8), F32)
    probs[0, :2] = 1e-6
    _, w = kernel_route(probs, None, s, from_logits=False)
    np.testing.assert_allclose(w, [[1e-6 / 6.103515625e-5] * 2], rtol=1e-6)


# -- the mixture ---------------------------------------------------------------------------------


def _raw(x: np.ndarray, t: int) -> np.ndarray:
    """GGUF rows (uint8 [n_out, row_bytes]) of float32 x [n_out, n_in] in type t."""
    if t == T.F32:
        return np.ascontiguousarray(x, F32).view(np.uint8)
    if t == T.F16:
        return x.astype(np.float16).view(np.uint8)
    return gguf.quants.quantize(x, T(t)).view(np.uint8)


def _matrix(rng, shape, t, backend, scale=0.2, bias=False) -> Matrix:
    x = (rng.standard_normal(shape) * scale).astype(F32)
    b = (rng.standard_normal(shape[0]) * 0.3).astype(F32) if bias else None
    return Matrix(_raw(x, t), int(t), shape[1], backend, b)


def _weights(seed, s: MoeSpec, d, types, backend="fast", shared=0, router_bias=False, probs_bias=False):
    """Random MoeWeights; types = (router, gate/up, down, shared) ggml types."""
    rng = np.random.default_rng(seed)
    tr, tgu, tdown, tsh = types
    e, f = s.n_expert, s.n_ff
    return MoeWeights(
        gate_inp=_matrix(rng, (e, d), tr, backend, scale=0.5, bias=router_bias),
        probs_bias=(rng.standard_normal(e) * 0.1).astype(F32) if probs_bias else None,
        gate=[_matrix(rng, (f, d), tgu, backend) for _ in range(e)],
        up=[_matrix(rng, (f, d), tgu, backend) for _ in range(e)],
        down=[_matrix(rng, (d, f), tdown, backend) for _ in range(e)],
        shared=tuple(_matrix(rng, shp, tsh, backend) for shp in ((shared, d), (shared, d), (d, shared)))
        if shared else None,
    )


def _ops(s: MoeSpec, act: str = "silu"):
    """(fast op, reference op) of one spec."""
    fast_op = fast.moe_topk(s, getattr(fast, f"gating_{s.gating}")(), getattr(fast, act)())
    ref_op = reference.moe_topk(s, getattr(reference, f"gating_{s.gating}")(), getattr(reference, act)())
    return fast_op, ref_op


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# (router, gate/up, down, shared) types with d, f: every n_in a multiple of the block size
MIXES = [
    ((T.F32, T.Q8_0, T.Q8_0, T.Q4_0), 64, 32),
    ((T.Q8_0, T.Q4_0, T.Q5_1, T.Q8_0), 128, 64),
    ((T.F32, T.Q4_1, T.Q5_0, T.F16), 96, 64),
    ((T.F16, T.BF16, T.F16, T.BF16), 64, 96),
    ((T.F32, T.F16, T.F32, T.F32), 40, 24),     # widths off the 32-lane grid: float kernels
]
CONFIGS = [
    dict(gating="softmax", weights_norm=True),
    dict(gating="sigmoid", weights_norm=True, weights_scale=2.5, n_group=4, n_group_used=2, n_expert_used=3),
    dict(gating="softmax", n_expert=6, n_expert_used=1),
]


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["softmax", "sigmoid-groups", "top1"])
@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "-".join(T(t).name for t in m[0]))
def test_fast_moe_matches_the_op_path(mix, cfg, n):
    """Same matrices, same products: the kernel and reference.moe_topk on fast matrices agree closely."""
    types, d, f = mix
    s = spec(n_ff=f, **cfg)
    extras = dict(shared=f, router_bias=True, probs_bias=True) if cfg["gating"] == "sigmoid" else {}
    w = _weights(1, s, d, types, **extras)
    fast_op, ref_op = _ops(s)
    x = np.random.default_rng(2).standard_normal((n, d)).astype(F32)
    assert fast_op.arrays(w) is not None  # the kernel runs, not the reference mixture
    assert _rel(fast_op(x, w), ref_op(x, w)) <= 1e-5


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu", "relu2"])
@pytest.mark.parametrize("n", [1, 5])
def test_float32_moe_matches_the_reference_backend(act, n):
    """float32 weights: the kernel (no activation quantization) against dense float32 reference matrices."""
    s = spec(gating="sigmoid", n_ff=48, weights_norm=True, n_group=2, n_group_used=1, n_expert_used=3)
    types = (T.F32,) * 4
    kw = dict(shared=32, router_bias=True, probs_bias=True)
    fast_op, ref_op = _ops(s, act)
    x = np.random.default_rng(3).standard_normal((n, 72)).astype(F32)
    got = fast_op(x, _weights(4, s, 72, types, "fast", **kw))
    assert _rel(got, ref_op(x, _weights(4, s, 72, types, "reference", **kw))) <= 2e-6


def test_many_tokens_equal_one_token_at_a_time():
    """Prefill groups the tokens of each expert into one product: each row as if run alone."""
    s = spec(n_expert=6, n_expert_used=2, n_ff=64, weights_norm=True)
    w = _weights(5, s, 128, (T.F32, T.Q4_0, T.Q8_0, T.Q4_0), shared=64)
    fast_op, _ = _ops(s)
    x = np.random.default_rng(6).standard_normal((37, 128)).astype(F32)
    rows = np.concatenate([fast_op(x[i:i + 1], w) for i in range(len(x))])
    np.testing.assert_allclose(fast_op(x, w), rows, rtol=0, atol=1e-6 * np.abs(rows).max())


def test_kernel_arrays_are_built_once_per_weights():
    s = spec(n_ff=32)
    w = _weights(7, s, 64, (T.F32, T.Q8_0, T.Q8_0, T.F32))
    fast_op, _ = _ops(s)
    assert fast_op.arrays(w) is fast_op.arrays(w)


def test_bad_input_is_refused_before_the_kernel():
    s = spec(n_ff=32)
    w = _weights(8, s, 64, (T.F32, T.Q8_0, T.Q8_0, T.F32))
    fast_op, _ = _ops(s)
    with pytest.raises(ShapeMismatch):
        fast_op(np.zeros((2, 63), F32), w)
    with pytest.raises(ShapeMismatch):
        fast_op(np.zeros(64, F32), w)
    with pytest.raises(ShapeMismatch):  # router rows disagree with the descriptor
        _ops(spec(n_expert=9, n_ff=32))[0](np.zeros((1, 64), F32), w)


def test_ops_without_kernel_parts_keep_the_reference_mixture():
    """A gating (or activation) op without a kernel part: the fast moe op runs the reference mixture
    and offers no fused layer."""
    s = spec(n_ff=32)
    w = _weights(9, s, 64, (T.F32, T.Q8_0, T.Q8_0, T.F32))
    _, ref_op = _ops(s)
    x = np.random.default_rng(9).standard_normal((3, 64)).astype(F32)
    for gating, act in ((reference.gating_softmax(), fast.silu()), (fast.gating_softmax(), reference.silu())):
        op = fast.moe_topk(s, gating, act)
        assert op.arrays(w) is None and op.fused_layer(w, ()) is None
        assert _rel(op(x, w), ref_op(x, w)) <= 1e-6
