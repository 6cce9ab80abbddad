"""archrun-llama4-ops against hand-written float64 math: chunk visibility, L2-normalised q/k, the
temperature tuning of global layers (at positions past 8192, where it starts to act), and expert
inputs scaled by the routing weight."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, MoeSpec
from archrun.io.weights import Matrix, MoeWeights
from archrun_llama4_ops import fast, ops

RNG = np.random.default_rng(11)
F32 = np.float32


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(F32)


def naive(q, k, v, q_pos, k_pos, scale, visible):
    """Softmax attention in float64 over the keys visible(i, j) allows; GQA by head // group."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    out = np.zeros((n, n_head, v.shape[2]))
    for i in range(n):
        keys = [j for j in range(len(k_pos)) if visible(q_pos[i], k_pos[j])]
        for h in range(n_head):
            s = np.array([float(q[i, h].astype(np.float64) @ k[j, h // group]) * scale for j in keys])
            p = np.exp(s - s.max())
            p /= p.sum()
            out[i, h] = sum(pj * v[j, h // group] for pj, j in zip(p, keys, strict=True))
    return out


def _l2(x):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("make", [ops.llama4_reference, fast.llama4_attention])
def test_chunked_layer_sees_its_chunk_only_on_l2_normalised_qk(make):
    chunk, n, n_head, kv, hd = 4, 11, 4, 2, 8
    spec = AttentionSpec(kind="llama4", n_head=n_head, n_head_kv=kv, head_dim=hd, v_head_dim=hd,
                         scale=1 / math.sqrt(hd), window=chunk)
    op = make(spec)
    q, k, v = rnd(n, n_head, hd), rnd(n, kv, hd), rnd(n, kv, hd)
    slot = op.new_slot(32)
    got = np.concatenate([op(q[:5], k[:5], v[:5], slot, 0), *(op(q[i:i + 1], k[i:i + 1], v[i:i + 1], slot, i)
                                                              for i in range(5, n))])
    pos = np.arange(n)
    want = naive(_l2(q), _l2(k), v, pos, pos, spec.scale, lambda i, j: j <= i and j // chunk == i // chunk)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("make", [ops.llama4_reference, fast.llama4_attention])
def test_global_layer_tunes_query_temperature(make):
    n, n_head, hd, start = 3, 2, 8, 8190  # positions 8190..8192: the scale steps up at pos + 1 = 8192
    spec = AttentionSpec(kind="llama4", n_head=n_head, n_head_kv=1, head_dim=hd, v_head_dim=hd, scale=0.35)
    op = make(spec)
    slot = op.new_slot(start + n)
    q, k, v = rnd(n, n_head, hd), rnd(start + n, 1, hd), rnd(start + n, 1, hd)
    slot.k[:start], slot.v[:start] = k[:start], v[:start]  # an earlier context
    got = op(q, k[start:], v[start:], slot, start)
    pos = np.arange(start, start + n)
    t = 1 + 0.1 * np.log(np.floor((pos + 1) / 8192) + 1)
    assert t[0] == 1.0 and t[-1] > 1.0
    want = naive(q * t[:, None, None], k, v, pos, np.arange(start + n), spec.scale, lambda i, j: j <= i)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def _f32(w, name=""):
    return Matrix(np.ascontiguousarray(w).view(np.uint8), 0, w.shape[1], "fast", None, name)


def test_routing_weight_scales_the_expert_input():
    d, f, n_exp, n = 10, 6, 4, 5
    spec = MoeSpec(kind="topk_input_weighted", activation="silu", n_expert=n_exp, n_expert_used=1, n_ff=f,
                   gating="sigmoid", weights_norm=False, n_shared=1, n_ff_shared=f)
    mats = {r: [rnd(f if r != "down" else d, d if r != "down" else f, scale=0.5) for _ in range(n_exp)]
            for r in ("gate", "up", "down")}
    shared = [rnd(f, d, scale=0.5), rnd(f, d, scale=0.5), rnd(d, f, scale=0.5)]
    router = rnd(n_exp, d)
    w = MoeWeights(gate_inp=_f32(router), probs_bias=None, gate=[_f32(m) for m in mats["gate"]],
                   up=[_f32(m) for m in mats["up"]], down=[_f32(m) for m in mats["down"]],
                   shared=tuple(_f32(m) for m in shared))
    from archrun_blocks import reference

    x = rnd(n, d)
    got = ops.topk_input_weighted(spec, reference.gating_sigmoid(), reference.silu())(x, w)

    def swiglu(gm, um, dm, xi):
        g, u = gm @ xi, um @ xi
        return dm @ (g / (1 + np.exp(-g)) * u)

    want = np.zeros((n, d))
    for t in range(n):
        logits = router.astype(np.float64) @ x[t]
        e = int(np.argmax(logits))
        xin = x[t] / (1 + np.exp(-logits[e]))  # top-1 of the logits, sigmoid of it scales the input
        want[t] = swiglu(mats["gate"][e], mats["up"][e], mats["down"][e], xin) + swiglu(*shared, x[t])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
