"""Every op with a fast factory agrees with its reference twin on random inputs of several shapes."""

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, RopeSpec
from archrun.plugins import make_plugin_manager
from archrun.vocab import build_vocabulary
from archrun_blocks import fast, reference

RNG = np.random.default_rng(3)
F32 = np.float32


def rnd(*shape):
    return RNG.standard_normal(shape).astype(F32)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


def test_every_registered_fast_op_is_covered_here():
    covered = {("norm", "rms"), ("rope", "neox"), ("rope", "norm"), ("attention", "causal"), ("ffn", "swiglu"),
               ("ffn", "geglu_tanh"), ("gating", "softmax"), ("gating", "sigmoid"),
               ("moe", "topk")}  # gating and moe: test_moe.py
    vocab = build_vocabulary(make_plugin_manager(names=["blocks"]))
    with_fast = {(e.op.slot, e.op.name) for e in vocab if e.op.fast is not None}
    assert with_fast <= covered, f"untested fast ops: {with_fast - covered}"


@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (3, 4, 128)])
def test_rms_norm(shape):
    x, w = rnd(*shape), rnd(shape[-1])
    close(fast.rms_norm(1e-6)(x, w), reference.rms_norm(1e-6)(x, w))


@pytest.mark.parametrize("pairing", ["neox", "norm"])
@pytest.mark.parametrize("n, heads, hd, n_rot", [(1, 4, 64, 64), (9, 2, 128, 64), (5, 3, 32, 16)])
def test_rope(pairing, n, heads, hd, n_rot):
    spec = RopeSpec(pairing=pairing, n_rot=n_rot, freq_base=1e4)
    ref = getattr(reference, f"rope_{pairing}")(spec)
    fst = getattr(fast, f"rope_{pairing}")(spec)
    cos, sin = ref.cos_sin(np.arange(100, 100 + n))
    x = rnd(n, heads, hd)
    close(fst(x, cos, sin), ref(x, cos, sin))


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("n, t0, heads, kv, hd", [(1, 20, 4, 2, 64), (8, 0, 6, 3, 32), (4, 12, 2, 1, 16)])
def test_attention(window, n, t0, heads, kv, hd):
    spec = AttentionSpec(kind="causal", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=hd, scale=hd ** -0.5,
                         window=window)
    ref, fst = reference.CausalAttention(spec), fast.causal_attention(spec)
    rs, fs = ref.new_slot(64), fst.new_slot(64)
    prefix = (rnd(t0, heads, hd), rnd(t0, kv, hd), rnd(t0, kv, hd))
    if t0:
        ref(*prefix, rs, 0)
        fst(*prefix, fs, 0)
    q, k, v = rnd(n, heads, hd), rnd(n, kv, hd), rnd(n, kv, hd)
    close(fst(q, k, v, fs, t0), ref(q, k, v, rs, t0))


@pytest.mark.parametrize("kind", ["swiglu", "geglu_tanh"])
@pytest.mark.parametrize("shape", [(1, 1536), (6, 96)])
def test_gated_activations(kind, shape):
    g, u = rnd(*shape) * 4, rnd(*shape)
    close(getattr(fast, kind)()(g, u), getattr(reference, kind)()(g, u))
