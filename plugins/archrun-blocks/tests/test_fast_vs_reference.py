"""What archrun's conformance kit (conftest.py) does not check of the fast ops: every fast op carries a
kernel part compiled for its slot's signature, and the causal attention's kernel part (what the fused
decode path calls for one token, reading and writing the cache) equals the reference, plain and in a
sliding layer's ring slot. Fast = reference on random, ragged and extreme inputs is the kit's."""

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, RopeSpec
from archrun.kernels.decode.parts import NO_TASK, compiled_for, usable
from archrun_blocks import fast, reference

RNG = np.random.default_rng(3)
F32 = np.float32
NONE = np.empty(0, F32)

NORMS = {"rms": (reference.rms_norm, fast.rms_norm), "layer": (reference.layer_norm, fast.layer_norm),
         "rms_1p": (reference.rms_norm_1p, fast.rms_norm_1p), "layer_1p": (reference.layer_norm_1p, fast.layer_norm_1p)}
ACTIVATIONS = ["silu", "gelu_tanh", "gelu", "relu2"]
RESIDUALS = {"sequential": (reference.Sequential, fast.sequential), "parallel": (reference.Parallel, fast.parallel)}


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(F32)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


def test_every_fast_op_carries_a_part_compiled_for_its_slot():
    """What lets the fused decode path run it (archrun.kernels.decode.parts)."""
    spec = AttentionSpec(kind="causal", n_head=2, n_head_kv=1, head_dim=8, v_head_dim=8, scale=0.5)
    rope = RopeSpec(pairing="neox", n_rot=8, freq_base=1e4)
    made = [(f(1e-6), "norm") for _, f in NORMS.values()]
    made += [(fast.rope_neox(rope), "rope"), (fast.rope_norm(rope), "rope"), (fast.causal_attention(spec), "attention")]
    made += [(getattr(fast, a)(), "activation") for a in ACTIVATIONS]
    made += [(g(), "gating") for g in (fast.gating_softmax, fast.gating_sigmoid, fast.gating_sparsemixer)]
    for op, slot in made:
        assert usable(op.fused, slot) is not None, (op, slot)
    for _, f in RESIDUALS.values():
        op = f(0.5)
        assert usable(op.fused, "residual") is not None and usable(op.fused_input, "residual") is not None
    assert compiled_for(made[0][0].fused.fn, "norm") and not compiled_for(made[0][0].fused.fn, "activation")


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
                 kc, vc, kpos, ring, pos % kc.shape[0] if ring else pos, pos, out, *NO_TASK)
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
                     kc, vc, kpos, True, pos % kc.shape[0], pos, out, *NO_TASK)
        close(out.reshape(4, 16), want[0])
