"""Every op with a fast factory agrees with its reference twin on random inputs of several shapes
(ragged sizes included), on the op-by-op path and through its kernel part (`op.fused`, what the
fused decode path calls for one token)."""

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, RopeSpec
from archrun.kernels.parts import compiled_for, slot_part
from archrun.plugins import make_plugin_manager
from archrun.vocab import build_vocabulary
from archrun_blocks import fast, reference

RNG = np.random.default_rng(3)
F32 = np.float32
NONE = np.empty(0, F32)

# every (slot, name) with a fast factory, covered here or in: test_moe.py for gating and moe (routing through
# the gating parts, the mixture kernel against reference.moe_topk), test_alibi.py for attention "alibi"
COVERED = {("norm", "rms"), ("norm", "layer"), ("norm", "rms_1p"), ("norm", "layer_1p"),
           ("rope", "neox"), ("rope", "norm"), ("attention", "causal"),
           ("attention", "alibi"),
           ("activation", "silu"), ("activation", "gelu_tanh"), ("activation", "gelu"), ("activation", "relu2"),
           ("residual", "sequential"), ("residual", "parallel"), ("gating", "softmax"), ("gating", "sigmoid"),
           ("moe", "topk")}
# no fast factory: the reference runs on both backends
REFERENCE_ONLY = {("softcap", "tanh"), ("activation", "swiglu_oai")}
NORMS = {"rms": (reference.rms_norm, fast.rms_norm), "layer": (reference.layer_norm, fast.layer_norm),
         "rms_1p": (reference.rms_norm_1p, fast.rms_norm_1p), "layer_1p": (reference.layer_norm_1p, fast.layer_norm_1p)}
ACTIVATIONS = ["silu", "gelu_tanh", "gelu", "relu2"]
RESIDUALS = {"sequential": (reference.Sequential, fast.sequential), "parallel": (reference.Parallel, fast.parallel)}


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(F32)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


def test_every_registered_op_is_covered_here():
    vocab = build_vocabulary(make_plugin_manager(names=["blocks"]))
    ops = {(e.op.slot, e.op.name) for e in vocab if e.plugin == "blocks" and e.op.slot != "block_style"}
    with_fast = {(e.op.slot, e.op.name) for e in vocab if e.plugin == "blocks" and e.op.fast is not None}
    assert ops <= COVERED | REFERENCE_ONLY, f"untested ops: {ops - COVERED - REFERENCE_ONLY}"
    assert with_fast <= COVERED, f"untested fast ops: {with_fast - COVERED}"
    assert not with_fast & REFERENCE_ONLY


def test_every_fast_op_carries_a_part_compiled_for_its_slot():
    """What lets the fused decode path run it (archrun.kernels.parts)."""
    spec = AttentionSpec(kind="causal", n_head=2, n_head_kv=1, head_dim=8, v_head_dim=8, scale=0.5)
    rope = RopeSpec(pairing="neox", n_rot=8, freq_base=1e4)
    made = [(f(1e-6), "norm") for _, f in NORMS.values()]
    made += [(fast.rope_neox(rope), "rope"), (fast.rope_norm(rope), "rope"), (fast.causal_attention(spec), "attention")]
    made += [(getattr(fast, a)(), "activation") for a in ACTIVATIONS]
    made += [(fast.gating_softmax(), "gating"), (fast.gating_sigmoid(), "gating")]
    for op, slot in made:
        assert slot_part(op, slot) is not None, (op, slot)
    for _, f in RESIDUALS.values():
        op = f(0.5)
        assert slot_part(op, "residual") is not None and slot_part(op, "residual", "fused_input") is not None
    assert compiled_for(made[0][0].fused.fn, "norm") and not compiled_for(made[0][0].fused.fn, "activation")


@pytest.mark.parametrize("kind", list(NORMS))
@pytest.mark.parametrize("shape", [(1, 1), (1, 64), (7, 577), (3, 4, 128), (2, 3, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_norm(kind, shape, bias):
    ref, fst = (f(1e-5) for f in NORMS[kind])
    x, w = rnd(*shape, scale=3.0) + F32(0.5), rnd(shape[-1])
    b = rnd(shape[-1]) if bias else None
    want = ref(x, w, b)
    close(fst(x, w, b), want)
    # the kernel part on one row, in place (out is x) as the layer kernel calls it
    row = np.ascontiguousarray(x.reshape(-1, shape[-1])[-1]).copy()
    fst.fused.fn(fst.fused.params, row, w, NONE if b is None else b, row)
    close(row, want.reshape(-1, shape[-1])[-1])


@pytest.mark.parametrize("pairing", ["neox", "norm"])
@pytest.mark.parametrize("n, heads, hd, n_rot", [(1, 4, 64, 64), (9, 2, 128, 64), (5, 3, 32, 16), (3, 5, 24, 8),
                                                 (2, 1, 6, 2)])
def test_rope(pairing, n, heads, hd, n_rot):
    spec = RopeSpec(pairing=pairing, n_rot=n_rot, freq_base=1e4)
    ref = getattr(reference, f"rope_{pairing}")(spec)
    fst = getattr(fast, f"rope_{pairing}")(spec)
    cos, sin = ref.cos_sin(np.arange(100, 100 + n))
    fcos, fsin = fst.cos_sin(np.arange(100, 100 + n))
    close(fcos, cos)
    close(fsin, sin)
    x = rnd(n, heads, hd)
    want = ref(x, cos, sin)
    close(fst(x, cos, sin), want)
    v = x[-1].reshape(-1).copy()
    fst.fused.fn(fst.fused.params, v, heads, hd, cos[-1], sin[-1])
    close(v.reshape(heads, hd), want[-1])


@pytest.mark.parametrize("softcap", [0.0, 3.0])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("n, t0, heads, kv, hd, vd", [(1, 20, 4, 2, 64, 64), (8, 0, 6, 3, 32, 32),
                                                      (4, 12, 2, 1, 16, 16), (3, 7, 5, 5, 12, 20), (1, 0, 3, 1, 8, 4)])
def test_attention(window, softcap, n, t0, heads, kv, hd, vd):
    spec = AttentionSpec(kind="causal", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=vd, scale=hd ** -0.5,
                         window=window, softcap=softcap)
    ref, fst = reference.CausalAttention(spec), fast.causal_attention(spec)
    rs, fs = ref.new_slot(64), fst.new_slot(64)
    prefix = (rnd(t0, heads, hd), rnd(t0, kv, hd), rnd(t0, kv, vd))
    if t0:
        ref(*prefix, rs, 0)
        fst(*prefix, fs, 0)
    q, k, v = rnd(n, heads, hd, scale=2.0), rnd(n, kv, hd), rnd(n, kv, vd)
    want = ref(q, k, v, rs, t0)
    close(fst(q, k, v, fs, t0), want)
    # the part: one token after the same context, through the op's cache slot arrays
    ps = fst.new_slot(64)
    if t0 or n > 1:
        fst(np.concatenate([prefix[0], q[:-1]]), np.concatenate([prefix[1], k[:-1]]),
            np.concatenate([prefix[2], v[:-1]]), ps, 0)
    kc, vc, kpos, ring = fst.slot_arrays(ps)
    pos = t0 + n - 1
    out = np.empty(heads * vd, F32)
    fst.fused.fn(fst.fused.params, q[-1].reshape(-1).copy(), k[-1].reshape(-1).copy(), v[-1].reshape(-1).copy(),
                 kc, vc, kpos, ring, pos % kc.shape[0] if ring else pos, pos, out)
    close(out.reshape(heads, vd), want[-1])


@pytest.mark.parametrize("window", [3, 6])
def test_attention_ring_slot(window):
    """A sliding layer's ring slot (window + max_rewind rows, positions wrap) on both ops and the part."""
    spec = AttentionSpec(kind="causal", n_head=4, n_head_kv=2, head_dim=16, v_head_dim=16, scale=0.25,
                         window=window)
    ref, fst = reference.CausalAttention(spec), fast.causal_attention(spec)
    rs, fs, ps = ref.new_slot(64, 2), fst.new_slot(64, 2), fst.new_slot(64, 2)
    assert isinstance(rs, reference.RingKvSlot)
    kc, vc, kpos, ring = fst.slot_arrays(ps)
    assert ring
    for pos in range(20):
        q, k, v = rnd(1, 4, 16), rnd(1, 2, 16), rnd(1, 2, 16)
        want = ref(q, k, v, rs, pos)
        close(fst(q, k, v, fs, pos), want)
        out = np.empty(64, F32)
        fst.fused.fn(fst.fused.params, q.reshape(-1).copy(), k.reshape(-1).copy(), v.reshape(-1).copy(),
                     kc, vc, kpos, True, pos % kc.shape[0], pos, out)
        close(out.reshape(4, 16), want[0])


@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 1536), (6, 96), (3, 17), (2, 3, 5)])
@pytest.mark.parametrize("gated", [True, False])
def test_activations(kind, shape, gated):
    g, u = rnd(*shape, scale=4.0), rnd(*shape)
    ref, fst = getattr(reference, kind)(), getattr(fast, kind)()
    want = ref(g, u) if gated else ref(g)
    close(fst(g, u) if gated else fst(g), want)
    row = np.ascontiguousarray(g.reshape(-1))
    out = np.empty_like(row)
    fst.fused.fn(fst.fused.params, row, out)
    close(out, ref(g).reshape(-1))


@pytest.mark.parametrize("kind", list(RESIDUALS))
@pytest.mark.parametrize("scale", [1.0, 0.37])
@pytest.mark.parametrize("d", [1, 31, 576])
def test_residuals(kind, scale, d):
    ref, fst = (f(scale) for f in RESIDUALS[kind])
    x, a, f = rnd(3, d), rnd(3, d), rnd(3, d)
    close(fst.ffn_input(x, a), ref.ffn_input(x, a))
    close(fst.combine(x, a, f), ref.combine(x, a, f))
    g = np.empty(d, F32)
    fst.fused_input.fn(fst.fused_input.params, x[0], a[0], g)
    close(g, ref.ffn_input(x, a)[0])
    row = x[0].copy()
    fst.fused.fn(fst.fused.params, row, a[0], f[0])
    close(row, ref.combine(x, a, f)[0])
