"""archrun-gemma4-ops against hand-written math: the layout's q/k/v (per-head norms, V = rms of the raw
keys without attn_v), the layer scalar, and KV sharing (a consumer attends over exactly the rows its
source saw, stores nothing, and refuses to run before its source)."""

from __future__ import annotations

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.errors import InvalidRequest
from archrun_blocks import reference
from archrun_gemma4_ops.attention import Gemma4Attention, SharedSlot
from archrun_gemma4_ops.layout import Gemma4Qkv
from archrun_gemma4_ops.residual import ScaledSequential

RNG = np.random.default_rng(4)
F32 = np.float32
EPS = 1e-6


def rnd(*shape):
    return RNG.standard_normal(shape).astype(F32)


def spec(window=0, source=-1, hd=8, kv=2):
    return AttentionSpec(kind="gemma4", n_head=4, n_head_kv=kv, head_dim=hd, v_head_dim=hd, scale=1.0,
                         window=window, params={"k_eq_v": 0.0, "kv_source": float(source)})


def rms(x, w):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


class _Binder:  # what Gemma4Attention.bind reads: a key for the layer registry
    pass


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_qkv_norms_and_value_from_raw_keys(k_eq_v):
    d, hd, n = 16, 8, 3
    wq, wk, wv = rnd(4 * hd, d), rnd(2 * hd, d), rnd(2 * hd, d)
    qn, kn = rnd(hd), rnd(hd)
    h = rnd(n, d)
    qkv = Gemma4Qkv((lambda x: x @ wq.T, qn), (lambda x: x @ wk.T, kn), None if k_eq_v else (lambda x: x @ wv.T),
                    reference.rms_norm(EPS), spec())
    q, k, v = qkv(h)
    raw_k = (h @ wk.T).reshape(n, 2, hd)
    raw_v = raw_k if k_eq_v else (h @ wv.T).reshape(n, 2, hd)
    np.testing.assert_allclose(q, rms((h @ wq.T).reshape(n, 4, hd), qn).reshape(n, -1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k, rms(raw_k, kn).reshape(n, -1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v, rms(raw_v, 1.0).reshape(n, -1), rtol=1e-5, atol=1e-5)


def test_layer_scalar_scales_the_whole_stream():
    res = ScaledSequential(1.0)
    res.layer_scalar = F32(0.25)
    x, a, f = rnd(2, 5), rnd(2, 5), rnd(2, 5)
    np.testing.assert_allclose(res.combine(x, a, f), (x + a + f) * 0.25, rtol=1e-6)
    np.testing.assert_allclose(res.ffn_input(x, a), x + a, rtol=1e-6)  # the FFN reads the unscaled stream


@pytest.mark.parametrize("window", [0, 3])
def test_consumer_attends_over_its_sources_rows(window):
    binder = _Binder()
    src, use = Gemma4Attention(spec(window)), Gemma4Attention(spec(window, source=0))
    src.bind(binder, 0)
    use.bind(binder, 1)
    slot = src.new_slot(12, max_rewind=2)
    shared = use.new_slot(12, max_rewind=2)
    assert isinstance(shared, SharedSlot) and shared.source is slot and shared.nbytes == 0
    plain = reference.CausalAttention(spec(window))
    plain_slot = plain.new_slot(12, max_rewind=2)
    start = 0
    for n in (5, 1, 1, 3):  # a prefill, two steps, a chunk: rows and ring wrap-around
        q, k, v, q2 = rnd(n, 4, 8), rnd(n, 2, 8), rnd(n, 2, 8), rnd(n, 4, 8)
        np.testing.assert_allclose(src(q, k, v, slot, start), plain(q, k, v, plain_slot, start), rtol=1e-6)
        # the consumer's own q over the source's keys: what plain attention over the same rows gives
        want = plain._attend(q2, *_rows(plain, plain_slot, k, v, start, window))
        got = use(q2, np.zeros_like(k), np.zeros_like(v), shared, start)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        start += n


def _rows(op, slot, k, v, start, window):
    """(q_pos, k_pos order as CausalAttention reads them) keys, values, q_pos, k_pos after the call."""
    n = len(k)
    q_pos = np.arange(start, start + n)
    if isinstance(slot, reference.RingKvSlot):  # the plain op already wrote: rebuild its view of the call
        keys, values, pos = slot.gather(start + n)
        keep = pos < start + n
        return keys[keep], values[keep], q_pos, pos[keep]
    keys, values = slot.rows(start + n)
    return keys, values, q_pos, np.arange(start + n)


def test_consumer_before_its_source_is_refused():
    binder = _Binder()
    src, use = Gemma4Attention(spec()), Gemma4Attention(spec(source=0))
    src.bind(binder, 0)
    use.bind(binder, 1)
    src.new_slot(8)
    shared = use.new_slot(8)
    with pytest.raises(InvalidRequest, match="before its source"):
        use(rnd(2, 4, 8), rnd(2, 2, 8), rnd(2, 2, 8), shared, 0)


def test_unbound_consumer_slot_costs_nothing():
    """`archrun inspect` asks an unbound op for its slot: a consumer's holds no rows."""
    assert Gemma4Attention(spec(source=0)).new_slot(64).nbytes == 0
