"""archrun-llama4-ops' kernels: the attention part the fused decode calls for one token, against
hand-written float64 math (chunk visibility across chunk boundaries on plain and ring slots, L2-normalised
q/k, the temperature of global layers past position 8192 over a long context's split attention) and against
the op-by-op fast op (the same bits); the fast input-weighted mixture against hand-written math."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, MoeSpec
from archrun.io.weights import Matrix, MoeWeights
from archrun.kernels.decode.parts import NO_TASK
from archrun_blocks import fast as blocks_fast
from archrun_llama4_ops import fast
from archrun_llama4_ops.kernels import attention

F32 = np.float32


def rnd(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def _l2(x):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)


def naive(q, keys, values, pos, key_pos, scale, visible):
    """One query q [H, hd] at `pos` over keys [T, KV, hd] / values [T, KV, vd] at key_pos, float64 softmax over
    the keys visible(pos, p) allows; head h reads kv head h // (H // KV)."""
    group = q.shape[0] // keys.shape[1]
    seen = [j for j in range(len(key_pos)) if visible(pos, key_pos[j])]
    out = np.zeros((q.shape[0], values.shape[2]))
    for h in range(q.shape[0]):
        s = np.array([q[h].astype(np.float64) @ keys[j, h // group] for j in seen]) * scale
        p = np.exp(s - s.max())
        p /= p.sum()
        out[h] = sum(pj * values[j, h // group].astype(np.float64) for pj, j in zip(p, seen, strict=True))
    return out


def _step(op, slot, q, k, v, pos):
    """The op's kernel part on one token (q [H, hd], k/v [KV, *]) at `pos`: its output [H, vd]."""
    p = op.fused
    kc, vc, kpos, ring = op.slot_arrays(slot)
    row = pos % kc.shape[0] if ring else pos
    out = np.full(q.shape[0] * v.shape[1], np.nan, F32)
    p.fn(p.params, q.reshape(-1).copy(), k.reshape(-1).copy(), v.reshape(-1).copy(), kc, vc, kpos, bool(ring), row,
         pos, out, *NO_TASK)
    return out.reshape(q.shape[0], v.shape[1])


@pytest.mark.parametrize("max_rewind", [64, 2], ids=["plain slot", "ring"])
def test_part_sees_its_chunk_on_l2_normalised_qk(max_rewind):
    chunk, n, heads, kv, hd = 4, 19, 4, 2, 8
    spec = AttentionSpec(kind="llama4", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=hd,
                         scale=1 / math.sqrt(hd), window=chunk)
    op = fast.llama4_attention(spec)
    slot = op.new_slot(32, max_rewind)
    assert op.slot_arrays(slot)[3] == (max_rewind < 32)  # a ring of chunk + 2 rows, which wraps
    rng = np.random.default_rng(3)
    q, k, v = rnd(rng, n, heads, hd, scale=3.0), rnd(rng, n, kv, hd, scale=3.0), rnd(rng, n, kv, hd)
    for pos in range(n):
        got = _step(op, slot, q[pos], k[pos], v[pos], pos)
        want = naive(_l2(q[pos]), _l2(k), v, pos, np.arange(n), spec.scale,
                     lambda i, j: j <= i and j // chunk == i // chunk)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), pos


def test_part_tunes_global_query_temperature_over_a_split_context():
    """Positions 8190..8192 of a global layer: every earlier row visible (the part's chunks of 128 keys,
    merged), the query scaled by 1 + 0.1 log(floor((pos + 1) / 8192) + 1), which steps up at pos 8191."""
    heads, hd, start, n = 2, 8, 8190, 3
    spec = AttentionSpec(kind="llama4", n_head=heads, n_head_kv=1, head_dim=hd, v_head_dim=hd, scale=0.35)
    op = fast.llama4_attention(spec)
    slot = op.new_slot(start + n)
    rng = np.random.default_rng(4)
    q, k, v = rnd(rng, n, heads, hd), rnd(rng, start + n, 1, hd), rnd(rng, start + n, 1, hd)
    slot.k[:start], slot.v[:start] = k[:start], v[:start]  # an earlier context
    for i, pos in enumerate(range(start, start + n)):
        got = _step(op, slot, q[i], k[pos], v[pos], pos)
        t = 1 + 0.1 * math.log(math.floor((pos + 1) / 8192) + 1)
        assert (t > 1.0) == (pos >= 8191)
        want = naive(q[i] * t, k, v, pos, np.arange(start + n), spec.scale, lambda i, j: j <= i)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), pos


@pytest.mark.parametrize("chunk", [16, 0], ids=["chunked", "global"])
def test_part_has_the_op_paths_bits(chunk):
    """Token by token, the kernel part and the fast op's op-by-op call on their own slots: the same outputs
    and the same cached rows, bit for bit (up to the one-pass attention's 128 rows)."""
    heads, kv, hd, n = 6, 2, 16, 40
    spec = AttentionSpec(kind="llama4", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=hd,
                         scale=1 / math.sqrt(hd), window=chunk)
    fused_op, op = fast.llama4_attention(spec), fast.llama4_attention(spec)
    assert fused_op.fused.fn is attention.llama4_attention
    fused_slot, slot = fused_op.new_slot(64), op.new_slot(64)
    rng = np.random.default_rng(5)
    for pos in range(n):
        q, k, v = rnd(rng, 1, heads, hd, scale=2.0), rnd(rng, 1, kv, hd, scale=2.0), rnd(rng, 1, kv, hd)
        np.testing.assert_array_equal(_step(fused_op, fused_slot, q[0], k[0], v[0], pos), op(q, k, v, slot, pos)[0])
    np.testing.assert_array_equal(fused_slot.k, slot.k)
    np.testing.assert_array_equal(fused_slot.v, slot.v)


def test_part_parameters_follow_the_ops_epsilon_and_qk_norm():
    """The part reads the op's epsilon and q/k norm choice as binding sets them (the model's RMS epsilon; no
    q/k norm in the 128-expert model): chunked attention on raw q/k then."""
    spec = AttentionSpec(kind="llama4", n_head=2, n_head_kv=1, head_dim=8, v_head_dim=8, scale=0.35, window=8)
    op = fast.llama4_attention(spec)
    op.eps, op.qk_norm = 1e-6, False
    assert list(op.fused.params) == [0.35, 8.0, 0.0, 1e-6, 0.0]
    slot = op.new_slot(16)
    rng = np.random.default_rng(6)
    q, k, v = rnd(rng, 11, 2, 8), rnd(rng, 11, 1, 8), rnd(rng, 11, 1, 8)
    for pos in range(11):
        got = _step(op, slot, q[pos], k[pos], v[pos], pos)
        want = naive(q[pos], k, v, pos, np.arange(11), 0.35, lambda i, j: j <= i and j // 8 == i // 8)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), pos


def test_prepare_rows_refuses_mismatched_shapes_before_any_kernel():
    from archrun.errors import ShapeMismatch

    spec = AttentionSpec(kind="llama4", n_head=2, n_head_kv=1, head_dim=8, v_head_dim=8, scale=0.35, window=8)
    op = fast.llama4_attention(spec)
    with pytest.raises(ShapeMismatch):
        op(np.zeros((2, 2, 8), F32), np.zeros((3, 1, 8), F32), np.zeros((3, 1, 8), F32), op.new_slot(8), 0)
    with pytest.raises(ShapeMismatch):
        op(np.zeros((3, 2, 8), F32), np.zeros((3, 1, 16), F32), np.zeros((3, 1, 8), F32), op.new_slot(8), 0)


def _f32(w):
    return Matrix(np.ascontiguousarray(w).view(np.uint8), 0, w.shape[1], "fast")


@pytest.mark.parametrize("k", [1, 2])
def test_fast_mixture_weights_the_expert_inputs(k):
    """The kernel mixture (not the numpy fallback) on float32 experts: routing weight times the input of each
    selected expert, outputs summed unweighted, plus the shared expert on the input as is."""
    d, f, n_exp, n = 32, 16, 4, 6
    rng = np.random.default_rng(7)
    spec = MoeSpec(kind="topk_input_weighted", activation="silu", n_expert=n_exp, n_expert_used=k, n_ff=f,
                   gating="sigmoid", weights_norm=False, n_shared=1, n_ff_shared=f)
    mats = {r: [rnd(rng, f if r != "down" else d, d if r != "down" else f, scale=0.5) for _ in range(n_exp)]
            for r in ("gate", "up", "down")}
    shared = [rnd(rng, f, d, scale=0.5), rnd(rng, f, d, scale=0.5), rnd(rng, d, f, scale=0.5)]
    router = rnd(rng, n_exp, d)
    w = MoeWeights(gate_inp=_f32(router), probs_bias=None, gate=[_f32(m) for m in mats["gate"]],
                   up=[_f32(m) for m in mats["up"]], down=[_f32(m) for m in mats["down"]],
                   shared=tuple(_f32(m) for m in shared))
    op = fast.topk_input_weighted(spec, blocks_fast.gating_sigmoid(), blocks_fast.silu())
    assert op.arrays(w) is not None  # the kernel runs
    x = rnd(rng, n, d)
    got = op(x, w)

    def swiglu(gm, um, dm, xi):
        g, u = gm.astype(np.float64) @ xi, um.astype(np.float64) @ xi
        return dm @ (g / (1 + np.exp(-g)) * u)

    want = np.zeros((n, d))
    for t in range(n):
        logits = router.astype(np.float64) @ x[t]
        for e in np.argsort(-logits, kind="stable")[:k]:  # sigmoid is monotone: the top-k logits
            xin = x[t] / (1 + np.exp(-logits[e]))
            want[t] += swiglu(mats["gate"][e], mats["up"][e], mats["down"][e], xin)
        want[t] += swiglu(*shared, x[t].astype(np.float64))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("chunk", [8, 0], ids=["chunked", "global"])
def test_parts_of_other_kv_types_have_the_op_paths_results(kv_type, chunk):
    """Caches of float16 and q8_0 rows: the part of that kv type (fused_for) stores the rows the op-by-op call
    stores and attends as it does (float16: the same bits; q8_0: its rows decoded a block at a time, float32
    rounding)."""
    from archrun_llama4_ops.kernels import kv_attention

    heads, kv, hd, n = 4, 2, 32, 20
    spec = AttentionSpec(kind="llama4", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=hd,
                         scale=1 / math.sqrt(hd), window=chunk)
    fused_op, op = fast.llama4_attention(spec), fast.llama4_attention(spec)
    p = fused_op.fused_for(kv_type)
    assert p.fn is getattr(kv_attention, f"llama4_attention_{kv_type}")
    fused_slot, slot = fused_op.new_slot(32, kv_type=kv_type), op.new_slot(32, kv_type=kv_type)
    rng = np.random.default_rng(8)
    for pos in range(n):
        q, k, v = rnd(rng, 1, heads, hd, scale=2.0), rnd(rng, 1, kv, hd, scale=2.0), rnd(rng, 1, kv, hd)
        kc, vc, kpos, ring = fused_op.slot_arrays(fused_slot)
        got = np.full(heads * hd, np.nan, F32)
        p.fn(p.params, q.reshape(-1).copy(), k.reshape(-1).copy(), v.reshape(-1).copy(), kc, vc, kpos, bool(ring),
             pos, pos, got, *NO_TASK)
        want = op(q, k, v, slot, pos)[0].reshape(-1)
        if kv_type == "f16":
            np.testing.assert_array_equal(got, want)
        else:
            assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max(), pos
    np.testing.assert_array_equal(fused_slot.k, slot.k)
    np.testing.assert_array_equal(fused_slot.v, slot.v)
