"""gpt-oss's vocabulary against hand-written float64 math: attention with learned sink logits (HF
appends the sink as one more softmax column and drops it), the clamped SwiGLU, and expert biases
in the mixture (the fast op runs the reference mixture then: its kernels read no expert biases)."""

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, MoeSpec
from archrun.io.weights import Matrix, MoeWeights
from archrun_blocks import fast, reference

RNG = np.random.default_rng(7)
F32 = np.float32


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(F32)


def naive_sink_attention(q, k, v, sinks, scale, window):
    """Per head: softmax over [scores of visible keys, sink], the sink column dropped; float64."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    out = np.zeros((n, n_head, v.shape[2]))
    for i in range(n):
        keys = [j for j in range(i + 1) if not window or j > i - window]
        for h in range(n_head):
            s = [float(q[i, h] @ k[j, h // group]) * scale for j in keys] + [float(sinks[h])]
            e = np.exp(np.array(s) - max(s))
            p = e / e.sum()
            out[i, h] = sum(p[t] * v[j, h // group] for t, j in enumerate(keys))
    return out


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("make", [reference.CausalAttention, fast.causal_attention])
def test_sinks_take_probability_mass(make, window):
    n, n_head, kv, hd = 6, 4, 2, 8
    spec = AttentionSpec(kind="causal", n_head=n_head, n_head_kv=kv, head_dim=hd, v_head_dim=hd,
                         scale=1 / math.sqrt(hd), window=window, sinks=True)
    op = make(spec)
    op.sinks = rnd(n_head, scale=2.0)  # what bind() reads from attn_sinks
    q, k, v = rnd(n, n_head, hd), rnd(n, kv, hd), rnd(n, kv, hd)
    slot = op.new_slot(16)
    got = np.concatenate([op(q[i:i + 1], k[i:i + 1], v[i:i + 1], slot, i) for i in range(n)])
    want = naive_sink_attention(q, k, v, op.sinks, spec.scale, window)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert getattr(op, "fused", None) is None  # no kernel part with sinks: op by op


def test_swiglu_oai_clamps_gate_and_up():
    act = reference.swiglu_oai()
    x = np.array([-9.0, -1.0, 0.5, 3.0, 8.0, 20.0], F32)
    up = np.array([-12.0, 0.3, -0.7, 9.0, 1.0, -8.0], F32)
    g = np.minimum(x.astype(np.float64), 7.0)
    want = g / (1 + np.exp(-1.702 * g)) * (np.clip(up, -7.0, 7.0) + 1.0)
    assert np.allclose(act(x, up), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError):
        act(x)


def _f32(w: np.ndarray, bias=None, name="") -> Matrix:
    """A float32 (ggml type 0) Matrix on the fast backend: its GGUF rows are the raw bytes."""
    return Matrix(np.ascontiguousarray(w).view(np.uint8), 0, w.shape[1], "fast", bias, name)


def _biased_experts(n_exp, n_in, n_out, bias):
    return [_f32(rnd(n_out, n_in, scale=0.3), bias[e], f"e{e}") for e in range(n_exp)]


def test_expert_and_shared_expert_biases_enter_every_projection():
    d, f, n_exp, n = 12, 8, 4, 5
    spec = MoeSpec(kind="topk", activation="swiglu_oai", n_expert=n_exp, n_expert_used=2, n_ff=f,
                   gating="softmax", weights_norm=True, gate_bias=True, up_bias=True, down_bias=True)
    bg, bu, bd = rnd(n_exp, f), rnd(n_exp, f), rnd(n_exp, d)
    sw = [rnd(f, d, scale=0.3), rnd(f, d, scale=0.3), rnd(d, f, scale=0.3)]  # a shared expert, biased too
    sb = [rnd(f), rnd(f), rnd(d)]
    w = MoeWeights(gate_inp=_f32(rnd(n_exp, d), rnd(n_exp), "router"), probs_bias=None,
                   gate=_biased_experts(n_exp, d, f, bg), up=_biased_experts(n_exp, d, f, bu),
                   down=_biased_experts(n_exp, f, d, bd),
                   shared=tuple(_f32(m, b, f"shexp{k}") for k, (m, b) in enumerate(zip(sw, sb, strict=True))))
    x = rnd(n, d)
    act = reference.swiglu_oai()
    got = fast.moe_topk(spec, fast.gating_softmax(), act)(x, w)
    # by hand: top-2 of the router logits, softmax over the two, biased expert FFNs
    want = np.zeros((n, d))
    logits = x @ w.gate_inp.dense.T + w.gate_inp.bias
    for t in range(n):
        top = np.argsort(-logits[t])[:2]
        p = np.exp(logits[t, top] - logits[t, top].max())
        p /= p.sum()
        for e, pe in zip(top, p, strict=True):
            gate = w.gate[e].dense @ x[t] + bg[e]
            up = w.up[e].dense @ x[t] + bu[e]
            want[t] += pe * (w.down[e].dense @ act(gate, up) + bd[e])
        want[t] += sw[2] @ act(sw[0] @ x[t] + sb[0], sw[1] @ x[t] + sb[1]) + sb[2]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
