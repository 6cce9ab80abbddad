"""archrun-recurrent's KDA (Kimi Delta Attention): the per-channel delta rule against hand-derived math and
its numba kernel, and the mixer's prefill, steps and rewinds through its StateSlot."""

from __future__ import annotations

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.plugins import make_plugin_manager
from archrun.vocab import build_vocabulary

rng = np.random.default_rng(7)


def test_plugin_registers_kda_as_a_mixer():
    vocab = build_vocabulary(make_plugin_manager(names=["recurrent"]))
    entry = vocab.entry("mixer", "kda")
    assert entry.plugin == "recurrent" and entry.op.layout is not None and entry.op.fast is not None


def _inputs(n, heads, dk, dv):
    q, k = (rng.standard_normal((n, heads, dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((n, heads, dv)).astype(np.float32)
    g = -rng.uniform(0.0, 3.0, (n, heads, dk)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n, heads)).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize("n,heads,dk,dv", [(1, 1, 4, 4), (9, 3, 8, 8), (20, 2, 16, 12)])
def test_fast_per_channel_delta_rule_equals_reference(n, heads, dk, dv):
    from archrun_recurrent.deltanet import delta_reference
    from archrun_recurrent.kernels.scan import delta_rule

    q, k, v, g, beta = _inputs(n, heads, dk, dv)
    s1 = rng.standard_normal((heads, dk, dv)).astype(np.float32)
    s2 = s1.copy()
    np.testing.assert_allclose(delta_rule(s1, q, k, v, g, beta), delta_reference(s2, q, k, v, g, beta),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s1, s2, rtol=1e-5, atol=1e-5)


def test_reference_per_channel_delta_rule_is_the_recurrence():
    """One head, dk = 2, dv = 1, written out by hand: S_t[i] = e^{g_t[i]} S_{t-1}[i] + k_t[i] u_t with
    u_t = beta_t (v_t - sum_i e^{g_t[i]} S_{t-1}[i] k_t[i]) and o_t = sum_i S_t[i] q_t[i] (HF's
    recurrent_kimi_delta_attention; its q arrives scaled here)."""
    from archrun_recurrent.deltanet import delta_reference

    q = np.array([[[1.0, 2.0]], [[0.5, -1.0]]], np.float32)
    k = np.array([[[0.6, 0.8]], [[1.0, 0.0]]], np.float32)
    v = np.array([[[3.0]], [[-2.0]]], np.float32)
    g = np.array([[[-0.5, -1.5]], [[-0.25, -2.0]]], np.float32)
    beta = np.array([[0.5], [0.75]], np.float32)
    s = np.array([1.0, -1.0])
    want = []
    for t in range(2):
        decayed = np.exp(g[t, 0].astype(float)) * s
        u = beta[t, 0] * (v[t, 0, 0] - decayed @ k[t, 0])
        s = decayed + k[t, 0] * u
        want.append(s @ q[t, 0])
    state = np.array([[[1.0], [-1.0]]], np.float32)
    got = delta_reference(state, q, k, v, g, beta)
    np.testing.assert_allclose(got[:, 0, 0], want, rtol=1e-6)
    np.testing.assert_allclose(state[0, :, 0], s, rtol=1e-6)


def test_per_channel_decay_equal_across_channels_is_gated_deltanet():
    """A decay that is the same on every key channel is gated DeltaNet's per-head decay."""
    from archrun_recurrent.deltanet import delta_reference

    q, k, v, g, beta = _inputs(6, 2, 4, 3)
    g_head = g[:, :, 0]
    s1, s2 = np.zeros((2, 4, 3), np.float32), np.zeros((2, 4, 3), np.float32)
    np.testing.assert_allclose(delta_reference(s1, q, k, v, np.repeat(g_head[:, :, None], 4, axis=2), beta),
                               delta_reference(s2, q, k, v, g_head, beta), rtol=1e-6, atol=1e-6)


class _Binder:
    """The tensors of one KDA layer (numpy order: rows are output features), bound as products."""

    def __init__(self, d, heads, dk, taps):
        inner = heads * dk

        def w(*shape, scale=1.0):
            return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

        self.t = {"attn_q": w(inner, d), "attn_k": w(inner, d), "attn_v": w(inner, d), "ssm_f_a": w(dk, d),
                  "ssm_f_b": w(inner, dk), "ssm_beta": w(heads, d), "ssm_g_a": w(dk, d), "ssm_g_b": w(inner, dk),
                  "attn_output": w(d, inner), "ssm_dt.bias": (0.1 * rng.standard_normal(inner)).astype(np.float32),
                  "ssm_a": -np.exp(rng.standard_normal((1, 1, heads, 1))).astype(np.float32),
                  "ssm_norm": (1 + 0.25 * rng.standard_normal(dk)).astype(np.float32)}
        for r in ("ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v"):
            self.t[r] = w(1, inner, 1, taps)
        self.d = type("D", (), {"norm_eps": 1e-5})()

    def matrix(self, role, layer):
        m = self.t[role]
        return lambda x: (x @ m.T).astype(np.float32)

    def table(self, role, layer):
        return self.t[role]

    vector = table


def _mixer(fast=False, d=16, heads=2, dk=8, taps=4):
    from archrun_recurrent.kda import kda_fast, kda_reference

    spec = AttentionSpec(kind="kda", n_head=heads, n_head_kv=heads, head_dim=dk, v_head_dim=dk,
                         scale=1.0 / np.sqrt(dk), params={"conv_kernel": taps, "full_gate": 0})
    op = (kda_fast if fast else kda_reference)(spec)
    op.bind(_Binder(d, heads, dk, taps), 0)
    return op


@pytest.mark.parametrize("fast", [False, True])
def test_mixer_prefill_equals_steps_and_rewinds(fast):
    ref = _mixer()
    op = _mixer(fast)
    op.__dict__.update({k: v for k, v in ref.__dict__.items() if k != "rule"})  # the same weights
    h = rng.standard_normal((30, 16)).astype(np.float32)
    whole = ref.mix(h, ref.new_slot(30, 8), 0)
    slot = op.new_slot(30, 8)
    got = np.concatenate([op.mix(h[:20], slot, 0)] + [op.mix(h[i:i + 1], slot, i) for i in range(20, 30)])
    np.testing.assert_allclose(got, whole, rtol=1e-4, atol=1e-5)
    slot.checkpoint(30)
    slot.rewind_to(25)                                          # within the ring: speculative drafts
    np.testing.assert_allclose(op.mix(h[25:], slot, 25), whole[25:], rtol=1e-4, atol=1e-5)
    slot.rewind_to(30)
    assert slot.n == 30


def test_mixer_output_is_hand_composed():
    """One token from a zero state: o = v_t * beta_t (k.q after l2 norms), then the gated norm and output
    projection; the decay does not matter for the first token."""
    op = _mixer(taps=2)
    b = op.__dict__
    h = rng.standard_normal((1, 16)).astype(np.float32)
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    conv = np.concatenate([b["q"](h), b["k"](h), b["v"](h)], axis=1) * b["conv_w"][:, 1]
    q, k, v = (silu(conv[:, i * 16:(i + 1) * 16]).reshape(2, 8) for i in range(3))
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(8)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    beta = 1 / (1 + np.exp(-b["beta_proj"](h)[0]))
    o = v * (beta * (k * q).sum(-1))[:, None]
    o = o / np.sqrt((o * o).mean(-1, keepdims=True) + 1e-5) * b["norm_w"]
    o = o / (1 + np.exp(-b["gate"](h).reshape(2, 8)))
    want = b["out_proj"](o.reshape(1, 16))
    np.testing.assert_allclose(op.mix(h, op.new_slot(1, 1), 0), want, rtol=1e-4, atol=1e-6)
