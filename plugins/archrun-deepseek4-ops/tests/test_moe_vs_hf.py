"""DeepSeek-V4's mixture against HF's own modules: the sqrt-softplus router (DeepseekV4TopKRouter), the
clamped SwiGLU of the shared expert (DeepseekV4MLP) and the whole block (DeepseekV4SparseMoeBlock), on
random weights, both backends; the gating's kernel part inside archrun-blocks' MoE kernel."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hash_moe_case import LIMIT, SCALE, D, E, F, K, hf_block, weights

from archrun.descriptor import MoeSpec
from archrun.errors import MetadataError
from archrun_blocks import fast, reference
from archrun_deepseek4_ops.gating import sqrtsoftplus, sqrtsoftplus_fast
from archrun_deepseek4_ops.swiglu import ClampLayout, swiglu_clamp, swiglu_clamp_fast

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

F32 = np.float32


@pytest.fixture(scope="module")
def block():
    """HF's MoE block (a top-k layer) with random weights and a nonzero selection bias."""
    return hf_block(hash_layer=False)


SPEC = MoeSpec(kind="topk", activation="swiglu_clamp", activation_params=(("limit", LIMIT),), n_expert=E,
               n_expert_used=K, n_ff=F, gating="sqrtsoftplus", weights_norm=True, weights_scale=SCALE,
               router_bias=True, n_shared=1, n_ff_shared=F)


def _x(n=9, seed=1):
    return np.random.default_rng(seed).standard_normal((n, D)).astype(F32)


def test_sqrtsoftplus_matches_hf_activation():
    act = pytest.importorskip("transformers.activations").ACT2FN["sqrtsoftplus"]
    logits = np.concatenate([np.linspace(-30, 30, 61), [19.9, 20.0, 20.1, -100.0]]).astype(F32)[None]
    want = act(torch.from_numpy(logits)).numpy()
    np.testing.assert_allclose(sqrtsoftplus()(logits), want, rtol=1e-6, atol=1e-10)
    np.testing.assert_array_equal(sqrtsoftplus_fast()(logits), sqrtsoftplus()(logits))


def test_gating_part_matches_reference():
    part = sqrtsoftplus_fast().fused
    logits = (np.random.default_rng(0).standard_normal((5, 40)) * 12).astype(F32)
    got = np.empty_like(logits)
    for i in range(len(logits)):
        part.fn(part.params, logits[i], got[i])
    np.testing.assert_allclose(got, sqrtsoftplus()(logits), rtol=2e-7, atol=0)


def test_router_matches_hf(block):
    x = _x(31)
    _, want_w, want_ids = block.gate(torch.from_numpy(x))
    logits = x @ block.gate.weight.detach().numpy().T
    ids, w = reference.route(sqrtsoftplus()(logits), block.gate.e_score_correction_bias.numpy(), SPEC)
    order = np.argsort(want_ids.numpy(), axis=1)
    np.testing.assert_array_equal(np.sort(ids, axis=1), np.take_along_axis(want_ids.numpy(), order, axis=1))
    got = np.take_along_axis(w, np.argsort(ids, axis=1), axis=1)
    np.testing.assert_allclose(got, np.take_along_axis(want_w.detach().numpy(), order, axis=1), rtol=1e-5)


def test_shared_expert_matches_hf_mlp(block):
    s, x = block.shared_experts, _x()
    want = s(torch.from_numpy(x)).detach().numpy()
    g, u, dn = (m.weight.detach().numpy() for m in (s.gate_proj, s.up_proj, s.down_proj))
    h = x @ g.T, x @ u.T
    assert (h[0] > LIMIT).any() and (np.abs(h[1]) > LIMIT).any()  # the clamps bind
    for act in (swiglu_clamp(LIMIT), swiglu_clamp_fast(LIMIT)):
        np.testing.assert_allclose(act(*h) @ dn.T, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_moe_block_matches_hf(block, backend):
    x = _x()
    want = block(torch.from_numpy(x)[None])[0].detach().numpy()
    if backend == "fast":
        op = fast.moe_topk(SPEC, sqrtsoftplus_fast(), swiglu_clamp_fast(LIMIT))
    else:
        op = reference.moe_topk(SPEC, sqrtsoftplus(), swiglu_clamp(LIMIT))
    got = op(x, weights(block, backend))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_moe_kernel_routes_with_the_part(block):
    """The MoE kernel with the sqrt-softplus part (SiLU experts: a part the kernel takes) against the
    reference mixture on the same weights."""
    spec = MoeSpec(**{**{a: getattr(SPEC, a) for a in ("kind", "n_expert", "n_expert_used", "n_ff", "gating",
                                                      "weights_norm", "weights_scale", "router_bias", "n_shared",
                                                      "n_ff_shared")}, "activation": "silu"})
    w, x = weights(block, "fast"), _x(6, seed=2)
    op = fast.moe_topk(spec, sqrtsoftplus_fast(), fast.silu())
    assert op.arrays(w) is not None  # the kernel runs, not the reference mixture
    want = reference.moe_topk(spec, sqrtsoftplus(), reference.silu())(x, weights(block, "reference"))
    assert np.abs(op(x, w) - want).max() <= 1e-5 * np.abs(want).max()


class _Meta:
    def __init__(self, keys):
        self.keys = keys

    def get(self, name, kind):
        return self.keys[name]

    def has(self, name):
        return name in self.keys

    def per_layer_floats(self, key, n):
        v = self.keys[key.removeprefix("{arch}.")]
        return tuple(v) if isinstance(v, list) else (v,) * n


def test_clamp_layout_reads_the_layer_limit():
    meta = _Meta({"block_count": 3, "swiglu_clamp_exp": [10.0, 7.0, 0.0], "swiglu_clamp_shexp": [10.0, 7.0, 0.0]})
    got = [ClampLayout().describe(SimpleNamespace(meta=meta, layer=i))["params"]["limit"] for i in range(3)]
    assert got == [10.0, 7.0, 0.0]
    x, up = np.array([[-3.0, 0.5, 12.0]], F32), np.array([[20.0, -20.0, 1.0]], F32)
    np.testing.assert_array_equal(swiglu_clamp(0.0)(x, up), reference.silu()(x, up))  # 0: no clamp
    meta.keys["swiglu_clamp_shexp"] = [10.0, 6.0, 0.0]
    with pytest.raises(MetadataError, match="layer 1"):
        ClampLayout().describe(SimpleNamespace(meta=meta, layer=1))
