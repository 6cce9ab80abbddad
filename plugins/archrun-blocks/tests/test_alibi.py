"""The ALiBi attention op ("alibi"): slopes against the published formula, the reference against a
direct float64 loop, and the fast op and its kernel part against the reference (plain and ring slots,
windows, softcap)."""

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.errors import MetadataError, ShapeMismatch
from archrun.kernels.decode.parts import NO_TASK, usable
from archrun.plugins import make_plugin_manager
from archrun.vocab import build_vocabulary
from archrun_blocks import elementwise, fast, reference

RNG = np.random.default_rng(11)
F32 = np.float32


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(F32)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


def spec(heads=4, kv=2, hd=16, vd=16, window=0, softcap=0.0, max_bias=8.0) -> AttentionSpec:
    return AttentionSpec(kind="alibi", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=vd, scale=hd ** -0.5,
                         window=window, softcap=softcap, alibi_max_bias=max_bias)


# -- slopes ---------------------------------------------------------------------------------------------


def ggml_slopes(n_head: int, max_bias: float) -> list[float]:
    """ggml_soft_max_ext's slopes, written out: n_head_log2 = 2^floor(log2 n_head),
    m0 = 2^(-max_bias / n_head_log2), m1 = 2^(-max_bias / 2 / n_head_log2)."""
    n_log2 = 1
    while n_log2 * 2 <= n_head:
        n_log2 *= 2
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    return [m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)]


@pytest.mark.parametrize("n_head", [1, 4, 8, 12, 16, 6, 20])
@pytest.mark.parametrize("max_bias", [8.0, 4.0])
def test_slopes_follow_ggml(n_head, max_bias):
    got = reference.alibi_slopes(n_head, max_bias)
    assert got.dtype == F32 and got.shape == (n_head,)
    np.testing.assert_allclose(got, ggml_slopes(n_head, max_bias), rtol=1e-6)


def test_slopes_of_the_alibi_paper():
    """Press et al.: for 8 heads (max bias 8) the slopes are 1/2, 1/4, ..., 1/256; for 12 heads the 8 of
    the nearest power of two followed by every other slope of 16 heads (2^-0.5, 2^-1.5, ...)."""
    np.testing.assert_allclose(reference.alibi_slopes(8, 8.0), [2.0 ** -(h + 1) for h in range(8)], rtol=1e-7)
    want12 = [2.0 ** -(h + 1) for h in range(8)] + [2.0 ** -(h + 0.5) for h in range(4)]
    np.testing.assert_allclose(reference.alibi_slopes(12, 8.0), want12, rtol=1e-6)
    np.testing.assert_allclose(reference.alibi_slopes(16, 8.0), [2.0 ** -((h + 1) / 2) for h in range(16)],
                               rtol=1e-6)
    np.testing.assert_array_equal(reference.alibi_slopes(1, 8.0), [2.0 ** -8])
    np.testing.assert_array_equal(reference.alibi_slopes(5, 0.0), np.ones(5))  # ggml: max_bias 0 -> slope 1


# -- the reference against a direct formula -------------------------------------------------------------


def direct(q, k, v, q_pos, k_pos, scale, window, softcap, slopes):
    """score(i, h, j) = cap(scale q_i,h . k_j,kv(h)) + slope_h (k_pos j - q_pos i) over the visible keys;
    softmax; sum of weights times values (float64 loops)."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    out = np.zeros((n, heads, v.shape[2]))
    for i in range(n):
        for h in range(heads):
            kv = h // group
            scores, rows = [], []
            for j in range(len(k)):
                if k_pos[j] > q_pos[i] or (window and k_pos[j] <= q_pos[i] - window):
                    continue
                s = scale * float(np.dot(q[i, h].astype(np.float64), k[j, kv]))
                if softcap:
                    s = softcap * math.tanh(s / softcap)
                scores.append(s + slopes[h] * (k_pos[j] - q_pos[i]))
                rows.append(j)
            w = np.exp(np.array(scores) - max(scores))
            w /= w.sum()
            out[i, h] = sum(wj * v[j, kv].astype(np.float64) for wj, j in zip(w, rows, strict=True))
    return out


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (4, 0.0), (0, 2.5)])
@pytest.mark.parametrize("heads, kv", [(4, 2), (6, 6), (12, 4)])
def test_reference_equals_the_direct_formula(window, softcap, heads, kv):
    s = spec(heads, kv, 8, 6, window, softcap)
    op = reference.AlibiAttention(s)
    n, t0 = 5, 9
    q, k, v = rnd(t0 + n, heads, 8), rnd(t0 + n, kv, 8), rnd(t0 + n, kv, 6)
    slot = op.new_slot(32)
    op(q[:t0], k[:t0], v[:t0], slot, 0)
    got = op(q[t0:], k[t0:], v[t0:], slot, t0)
    pos = np.arange(t0 + n)
    want = direct(q[t0:], k, v, pos[t0:], pos, s.scale, window, softcap, ggml_slopes(heads, 8.0))
    close(got, want.astype(F32), 2e-6)


def test_the_bias_matters_and_is_the_only_difference_from_causal():
    """With every slope 0 ALiBi is causal attention; with the model's slopes far keys lose weight."""
    s = spec(4, 2, 8, 8)
    q, k, v = rnd(6, 4, 8), rnd(6, 2, 8), rnd(6, 2, 8)
    pos = np.arange(6)
    causal = reference.attend(q, k, v, pos, pos, s.scale, 0)
    close(reference.attend(q, k, v, pos, pos, s.scale, 0, 0.0, np.zeros(4, F32)), causal, 1e-7)
    assert np.abs(reference.AlibiAttention(s)(q, k, v, reference.KvSlot(6, 2, 8, 8), 0) - causal).max() > 1e-3


def test_causal_refuses_a_model_that_states_an_alibi_bias():
    with pytest.raises(MetadataError, match="max_alibi_bias"):
        reference.CausalAttention(AttentionSpec(kind="causal", n_head=2, n_head_kv=1, head_dim=8, v_head_dim=8,
                                                scale=0.5, alibi_max_bias=8.0))


# -- fast op and kernel part against the reference ------------------------------------------------------


def test_alibi_is_registered_with_a_fast_op_and_a_part():
    vocab = build_vocabulary(make_plugin_manager(names=["blocks"]))
    entry = vocab.entry("attention", "alibi")
    assert entry.plugin == "blocks" and entry.op.fast is not None
    op = fast.alibi_attention(spec())
    assert usable(op.fused, "attention") is not None and callable(op.slot_arrays)
    p = op.fused.params
    assert list(p[:5]) == [0.25, 0.0, 0.0, 8.0, 4.0]
    np.testing.assert_array_equal(p[5:], reference.alibi_slopes(4, 8.0))


def test_elementwise_attention_checks_slopes():
    q, k = rnd(2, 4, 8), rnd(2, 2, 8)
    pos = np.arange(2)
    with pytest.raises(ShapeMismatch, match="slopes"):
        elementwise.attention(q, k, k, pos, pos, 1.0, 0, 0.0, np.ones(3, F32))


@pytest.mark.parametrize("softcap", [0.0, 3.0])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("n, t0, heads, kv, hd, vd", [(1, 20, 4, 2, 64, 64), (8, 0, 6, 3, 32, 32),
                                                      (4, 12, 12, 4, 16, 16), (3, 7, 5, 5, 12, 20),
                                                      (1, 0, 3, 1, 8, 4)])
def test_fast_op_and_part_equal_the_reference(window, softcap, n, t0, heads, kv, hd, vd):
    s = spec(heads, kv, hd, vd, window, softcap)
    ref, fst = reference.AlibiAttention(s), fast.alibi_attention(s)
    rs, fs = ref.new_slot(64), fst.new_slot(64)
    prefix = (rnd(t0, heads, hd), rnd(t0, kv, hd), rnd(t0, kv, vd))
    if t0:
        ref(*prefix, rs, 0)
        fst(*prefix, fs, 0)
    q, k, v = rnd(n, heads, hd, scale=2.0), rnd(n, kv, hd), rnd(n, kv, vd)
    want = ref(q, k, v, rs, t0)
    close(fst(q, k, v, fs, t0), want)
    ps = fst.new_slot(64)  # the part: the last token after the same context, through the slot arrays
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
def test_ring_slot(window):
    """A sliding ALiBi layer's ring slot (positions wrap; a rewind leaves newer rows behind) on both ops
    and the part."""
    s = spec(4, 2, 16, 16, window)
    ref, fst = reference.AlibiAttention(s), fast.alibi_attention(s)
    rs, fs, ps = ref.new_slot(64, 2), fst.new_slot(64, 2), fst.new_slot(64, 2)
    assert isinstance(rs, reference.RingKvSlot)
    kc, vc, kpos, ring = fst.slot_arrays(ps)
    assert ring
    for pos in [*range(20), 18, 19, 20]:  # 18..: after a two-token rewind
        q, k, v = rnd(1, 4, 16), rnd(1, 2, 16), rnd(1, 2, 16)
        want = ref(q, k, v, rs, pos)
        close(fst(q, k, v, fs, pos), want)
        out = np.empty(64, F32)
        fst.fused.fn(fst.fused.params, q.reshape(-1).copy(), k.reshape(-1).copy(), v.reshape(-1).copy(),
                     kc, vc, kpos, True, pos % kc.shape[0], pos, out, *NO_TASK)
        close(out.reshape(4, 16), want[0])


def test_large_distances_stay_finite():
    """Far keys get large negative biases (slope 1/2 per position here): the softmax stays finite."""
    s = spec(2, 1, 8, 8, max_bias=2.0)
    fst, ref = fast.alibi_attention(s), reference.AlibiAttention(s)
    t = 600
    q, k, v = rnd(t, 2, 8), rnd(t, 1, 8), rnd(t, 1, 8)
    fs, rs = fst.new_slot(t), ref.new_slot(t)
    got, want = fst(q, k, v, fs, 0), ref(q, k, v, rs, 0)
    assert np.isfinite(got).all()
    close(got, want)
