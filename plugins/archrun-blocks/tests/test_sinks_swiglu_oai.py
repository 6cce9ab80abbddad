"""gpt-oss's vocabulary against hand-written float64 math: attention with learned sink logits (HF
appends the sink as one more softmax column and drops it), the clamped SwiGLU, and expert biases
in the mixture; and their kernels, which decode gpt-oss fused: the attention part with the sinks among its
parameters (every kv type, plain slots and rings, one pass and split past SPLIT_MIN_ROWS rows), the clamped
SwiGLU as a gated activation part (it reads up itself), the experts' biases in the MoE kernel's products."""

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, MoeSpec
from archrun.errors import ShapeMismatch
from archrun.io.weights import Matrix, MoeWeights
from archrun.kernels.decode.parts import NO_TASK, is_gated
from archrun_blocks import fast, moe_kernels, reference
from archrun_blocks.decode_attention import SPLIT_MIN_ROWS

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
    op.bind(_Sinks(rnd(n_head, scale=2.0)), 0)
    q, k, v = rnd(n, n_head, hd), rnd(n, kv, hd), rnd(n, kv, hd)
    slot = op.new_slot(16)
    got = np.concatenate([op(q[i:i + 1], k[i:i + 1], v[i:i + 1], slot, i) for i in range(n)])
    want = naive_sink_attention(q, k, v, op.sinks, spec.scale, window)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # the whole prompt at once: the fast op's kernel attention with sinks for many queries too
    whole = op(q, k, v, op.new_slot(16), 0)
    assert np.abs(whole - want).max() <= 1e-5 * np.abs(want).max()


class _Sinks:
    """A binder stand-in: its `attn_sinks` vector (what the attention op's bind reads)."""

    def __init__(self, sinks: np.ndarray):
        self.sinks = sinks

    def vector(self, role: str, layer: int) -> np.ndarray:
        assert role == "attn_sinks"
        return self.sinks


def _sink_spec(window=0, n_head=4, kv=2, hd=32):
    return AttentionSpec(kind="causal", n_head=n_head, n_head_kv=kv, head_dim=hd, v_head_dim=hd,
                         scale=1 / math.sqrt(hd), window=window, sinks=True)


def test_sink_attention_parts_exist_once_the_sinks_are_bound():
    op = fast.causal_attention(_sink_spec())
    assert op.fused is None and op.fused_for is None  # nothing to attend with yet
    op.bind(_Sinks(rnd(4)), 0)
    assert op.fused is not None and list(op.fused.params[3:]) == [float(s) for s in op.sinks]
    assert op.fused_for("q8_0") is not None
    with pytest.raises(ShapeMismatch):  # a sinks vector of another width: refused at bind, before any kernel
        fast.causal_attention(_sink_spec()).bind(_Sinks(rnd(3)), 0)


def _stored(kv_type, x):
    """The float32 values rows x [n, KV, w] hold once stored as kv_type."""
    c = reference.NumpyKvCodec
    return x if kv_type == "f32" else c.decode(kv_type, c.encode(kv_type, np.ascontiguousarray(x, F32)))


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("window", [0, 40])
def test_sink_attention_part_is_sink_attention(kv_type, window):
    """The kernel part, SPLIT_MIN_ROWS - 2 cached tokens on (the last one-pass steps, then the split's), and a
    rewind of 2, against float64 softmax attention with the sinks over the rows the slot holds (a ring of
    window + 8 rows for the window: it wraps); one sink far above every score (it takes almost all the mass)."""
    n_head, kv, hd = 4, 2, 32
    spec = _sink_spec(window, n_head, kv, hd)
    op = fast.causal_attention(spec)
    sinks = rnd(n_head, scale=2.0)
    sinks[1] = 30.0
    op.bind(_Sinks(sinks), 0)
    part = op.fused if kv_type == "f32" else op.fused_for(kv_type)
    t0 = SPLIT_MIN_ROWS - 2
    slot = op.new_slot(2 * SPLIT_MIN_ROWS, 8, **({} if kv_type == "f32" else {"kv_type": kv_type}))
    keys, values = rnd(t0, kv, hd), rnd(t0, kv, hd)
    op(rnd(t0, n_head, hd), keys, values, slot, 0)
    held = {p: (_stored(kv_type, keys[p:p + 1])[0], _stored(kv_type, values[p:p + 1])[0]) for p in range(t0)}
    kc, vc, kpos, ring = op.slot_arrays(slot)
    assert ring == bool(window)
    for pos in (t0, t0 + 1, t0 + 2, t0 + 3, t0 + 2, t0 + 3):  # the last two after a rewind of 2
        q, k, v = rnd(n_head * hd, scale=2.0), rnd(kv * hd), rnd(kv * hd)
        out = np.full(n_head * hd, np.nan, F32)
        row = pos % kc.shape[0] if ring else pos
        part.fn(part.params, q, k, v, kc, vc, kpos, ring, row, pos, out, *NO_TASK)
        held[pos] = (_stored(kv_type, k.reshape(1, kv, hd))[0], _stored(kv_type, v.reshape(1, kv, hd))[0])
        for p in [p for p in held if p > pos]:  # rewound: positions past pos are overwritten later
            del held[p]
        seen = [p for p in held if not window or p > pos - window]
        ks = np.stack([held[p][0] for p in seen])[None]
        vs = np.stack([held[p][1] for p in seen])[None]
        qs = q.reshape(1, n_head, hd)
        # the naive attention's query 0 sees every row given (positions relabelled 0 .. n - 1 in order)
        want = _naive_last(qs, ks[0], vs[0], sinks, spec.scale).reshape(-1)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max(),
                                   err_msg=f"{kv_type} window {window} position {pos}")


def _naive_last(q, k, v, sinks, scale):
    """Float64 attention of one query q [1, H, hd] over every row of k/v [T, KV, *], with sinks."""
    n_head, group = q.shape[1], q.shape[1] // k.shape[1]
    out = np.zeros((n_head, v.shape[2]))
    for h in range(n_head):
        s = list(k[:, h // group].astype(np.float64) @ q[0, h].astype(np.float64) * scale) + [float(sinks[h])]
        e = np.exp(np.array(s) - max(s))
        out[h] = (e[:-1] / e.sum()) @ v[:, h // group].astype(np.float64)
    return out


@pytest.mark.parametrize("make", [reference.swiglu_oai, fast.swiglu_oai])
def test_swiglu_oai_clamps_gate_and_up(make):
    act = make()
    x = np.array([-9.0, -1.0, 0.5, 3.0, 8.0, 20.0], F32)
    up = np.array([-12.0, 0.3, -0.7, 9.0, 1.0, -8.0], F32)
    g = np.minimum(x.astype(np.float64), 7.0)
    want = g / (1 + np.exp(-1.702 * g)) * (np.clip(up, -7.0, 7.0) + 1.0)
    assert np.allclose(act(x, up), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError):
        act(x)


def test_swiglu_oai_part_is_gated_and_exact():
    """The fast op's part reads up itself (a gated part: the layer kernel does not multiply by up) and is
    the clamped SwiGLU in float64 to float32 rounding (a few ulp: exp by a polynomial); the op by op path
    runs the same part over rows (the same bits)."""
    act = fast.swiglu_oai()
    assert is_gated(act.fused)
    gate, up = rnd(3, 257, scale=6.0), rnd(3, 257, scale=6.0)
    g = np.minimum(gate.astype(np.float64), 7.0)
    want = g / (1 + np.exp(-1.702 * g)) * (np.clip(up.astype(np.float64), -7.0, 7.0) + 1.0)
    got = act(gate, up)
    assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()
    row = np.full(257, np.nan, F32)
    act.fused.fn(act.fused.params, gate[1].copy(), up[1].copy(), row)
    assert np.array_equal(row, got[1])


def _f32(w: np.ndarray, bias=None, name="") -> Matrix:
    """A float32 (ggml type 0) Matrix on the fast backend: its GGUF rows are the raw bytes."""
    return Matrix(np.ascontiguousarray(w).view(np.uint8), 0, w.shape[1], "fast", bias, name)


def _biased_experts(n_exp, n_in, n_out, bias):
    return [_f32(rnd(n_out, n_in, scale=0.3), bias[e], f"e{e}") for e in range(n_exp)]


SPEC = dict(kind="topk", activation="swiglu_oai", n_expert_used=2, gating="softmax", weights_norm=True,
            gate_bias=True, up_bias=True, down_bias=True)


@pytest.mark.parametrize("kernels", [False, True])
def test_expert_and_shared_expert_biases_enter_every_projection(kernels):
    """The fast mixture with the reference activation (no part: the reference mixture on fast products) and with
    the fast one (its gated part: the MoE kernel, each expert product adding its bias)."""
    d, f, n_exp, n = 12, 8, 4, 5
    spec = MoeSpec(n_expert=n_exp, n_ff=f, **SPEC)
    bg, bu, bd = rnd(n_exp, f), rnd(n_exp, f), rnd(n_exp, d)
    sw = [rnd(f, d, scale=0.3), rnd(f, d, scale=0.3), rnd(d, f, scale=0.3)]  # a shared expert, biased too
    sb = [rnd(f), rnd(f), rnd(d)]
    w = MoeWeights(gate_inp=_f32(rnd(n_exp, d), rnd(n_exp), "router"), probs_bias=None,
                   gate=_biased_experts(n_exp, d, f, bg), up=_biased_experts(n_exp, d, f, bu),
                   down=_biased_experts(n_exp, f, d, bd),
                   shared=tuple(_f32(m, b, f"shexp{k}") for k, (m, b) in enumerate(zip(sw, sb, strict=True))))
    x = rnd(n, d)
    act = reference.swiglu_oai()
    moe = fast.moe_topk(spec, fast.gating_softmax(), fast.swiglu_oai() if kernels else act)
    assert (moe.arrays(w) is not None) == kernels
    got = moe(x, w)
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


def test_an_expert_bias_of_another_width_is_refused():
    d, f, n_exp = 12, 8, 4
    spec = MoeSpec(n_expert=n_exp, n_ff=f, **SPEC)
    b = rnd(n_exp, f)
    w = MoeWeights(gate_inp=_f32(rnd(n_exp, d), None, "router"), probs_bias=None,
                   gate=_biased_experts(n_exp, d, f, b), up=_biased_experts(n_exp, d, f, b),
                   down=_biased_experts(n_exp, f, d, b), shared=None)  # down biases [f], not [d]
    with pytest.raises(ShapeMismatch, match="expert 0 down bias"):
        fast.moe_topk(spec, fast.gating_softmax(), fast.swiglu_oai())(rnd(2, d), w)
    with pytest.raises(ShapeMismatch):
        moe_kernels.moe_arrays(w.gate_inp.prepared, None, None, [m.prepared for m in w.gate],
                               [m.prepared for m in w.up], [m.prepared for m in w.down], None, biases=[None] * 5)
