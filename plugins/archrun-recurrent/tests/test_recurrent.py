"""archrun-recurrent: registration, the short convolution against hand-derived math and its fast
kernel, and the StateSlot's rewind bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.errors import InvalidRequest
from archrun.plugins import make_plugin_manager
from archrun.vocab import build_vocabulary
from archrun_recurrent.shortconv import ShortConv, conv_reference
from archrun_recurrent.state import StateSlot

rng = np.random.default_rng(0)


def test_plugin_registers_shortconv_as_a_mixer():
    vocab = build_vocabulary(make_plugin_manager(names=["recurrent"]))
    entry = vocab.entry("mixer", "shortconv")
    assert entry.plugin == "recurrent" and entry.op.layout is not None and entry.op.fast is not None
    assert ("attention", "shortconv") not in vocab  # a token mixer is not an attention op


@pytest.mark.parametrize("n,d,taps", [(1, 8, 2), (7, 16, 3), (33, 5, 4)])
def test_fast_conv_equals_reference(n, d, taps):
    from archrun_recurrent.kernels.conv import gated_conv

    ext = rng.standard_normal((n + taps - 1, d)).astype(np.float32) * 10
    w, c = rng.standard_normal((d, taps)).astype(np.float32), rng.standard_normal((n, d)).astype(np.float32)
    np.testing.assert_allclose(gated_conv(ext, w, c), conv_reference(ext, w, c), rtol=1e-5, atol=1e-5)


def test_reference_conv_is_a_causal_depthwise_convolution():
    """conv[t, i] = sum_j w[i, j] x[t - (L-1) + j, i], zeros before the first token (torch's Conv1d
    with groups=d and L-1 padding, truncated to n)."""
    n, d, taps = 6, 3, 3
    x, w = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal((d, taps)).astype(np.float32)
    want = np.zeros((n, d), np.float32)
    for t in range(n):
        for j in range(taps):
            src = t - (taps - 1) + j
            if src >= 0:
                want[t] += w[:, j] * x[src]
    ext = np.concatenate([np.zeros((taps - 1, d), np.float32), x])
    np.testing.assert_allclose(conv_reference(ext, w, np.ones((n, d), np.float32)), want, rtol=1e-6, atol=1e-6)


class _Binder:
    def __init__(self, d, taps):
        self.t = {"shortconv.in_proj": rng.standard_normal((3 * d, d)).astype(np.float32) / d,
                  "shortconv.conv": rng.standard_normal((d, taps)).astype(np.float32),
                  "shortconv.out_proj": rng.standard_normal((d, d)).astype(np.float32) / d}

    def matrix(self, role, layer):
        w = self.t[role]
        return lambda x: x @ w.T

    def table(self, role, layer):
        return self.t[role]


def _mixer(d=8, taps=3):
    spec = AttentionSpec(kind="shortconv", n_head=1, n_head_kv=1, head_dim=d, v_head_dim=d, scale=1.0,
                         params={"l_cache": taps, "width": d})
    op = ShortConv(spec)
    op.bind(_Binder(d, taps), 0)
    return op


def test_mixer_prefill_equals_steps_and_rewinds():
    op = _mixer()
    h = rng.standard_normal((12, 8)).astype(np.float32)
    whole = op.mix(h, op.new_slot(12, 4), 0)
    slot = op.new_slot(12, 4)
    steps = np.concatenate([op.mix(h[i:i + 1], slot, i) for i in range(12)])
    np.testing.assert_allclose(steps, whole, rtol=1e-5, atol=1e-6)
    slot.rewind_to(9)
    np.testing.assert_allclose(op.mix(h[9:], slot, 9), whole[9:], rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidRequest, match="continue at position"):
        op.mix(h[:1], slot, 5)


def test_state_slot_ring_and_checkpoints():
    slot = StateSlot({"s": (2,)}, recent=3, max_checkpoints=2)
    for length in range(1, 9):            # state after `length` tokens = [length, length]
        slot.state["s"][:] = length
        slot.keep(length)
        if length in (2, 4, 5):
            slot.checkpoint(length)
    assert slot.rewind_reach == 3 and slot.checkpoints == (4, 5)   # the oldest checkpoint went
    assert [slot.can_restore(n) for n in (0, 2, 4, 5, 6, 8)] == [True, False, True, True, True, True]
    slot.rewind_to(6)
    assert slot.state["s"][0] == 6 and slot.rewind_reach == 1
    slot.rewind_to(4)                      # from a checkpoint: the ring starts again there
    assert slot.state["s"][0] == 4 and slot.rewind_reach == 0 and slot.checkpoints == (4,)
    slot.state["s"][:] = 99
    slot.keep(6)                           # a gap (5 not kept): the ring's reach starts at 6
    assert not slot.can_restore(5) and slot.can_restore(6)


def test_state_bytes_and_clear():
    slot = StateSlot({"a": (2, 3), "b": (4,)}, recent=1)
    assert slot.state_bytes == 40 and slot.nbytes == 3 * 40
    slot.state["a"][:] = 1
    slot.keep(1)
    slot.checkpoint(1)
    assert slot.nbytes == 4 * 40
    slot.clear()
    assert slot.n == 0 and not slot.checkpoints and not slot.state["a"].any()


def test_plugin_registers_mamba2_as_a_mixer():
    vocab = build_vocabulary(make_plugin_manager(names=["recurrent"]))
    assert vocab.entry("mixer", "mamba2").op.layout is not None and ("attention", "mamba2") not in vocab


@pytest.mark.parametrize("n,heads,width,dims", [(1, 2, 3, 4), (9, 4, 8, 16), (5, 1, 1, 1)])
def test_fast_scan_equals_reference(n, heads, width, dims):
    from archrun_recurrent.kernels.scan import selective_scan
    from archrun_recurrent.mamba2 import scan_reference

    x = rng.standard_normal((n, heads, width)).astype(np.float32)
    dt = np.abs(rng.standard_normal((n, heads))).astype(np.float32)
    a = -np.abs(rng.standard_normal(heads)).astype(np.float32) * 4
    b, c = (rng.standard_normal((n, heads, dims)).astype(np.float32) for _ in range(2))
    s0 = rng.standard_normal((heads, width, dims)).astype(np.float32)
    s1, s2 = s0.copy(), s0.copy()
    np.testing.assert_allclose(selective_scan(s1, x, dt, a, b, c), scan_reference(s2, x, dt, a, b, c),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-5)


def test_reference_scan_is_the_recurrence():
    """One head, one channel, one state dim: s_t = exp(dt a) s_{t-1} + dt x b; y = s c."""
    from archrun_recurrent.mamba2 import scan_reference

    x, dt, b, c = [0.5, -1.0], [0.2, 0.7], [2.0, 3.0], [1.5, -0.5]
    s, want = 0.0, []
    for t in range(2):
        s = np.exp(dt[t] * -1.3) * s + dt[t] * x[t] * b[t]
        want.append(s * c[t])
    state = np.zeros((1, 1, 1), np.float32)
    got = scan_reference(state, np.array(x, np.float32).reshape(2, 1, 1), np.array(dt, np.float32).reshape(2, 1),
                         np.array([-1.3], np.float32), np.array(b, np.float32).reshape(2, 1, 1),
                         np.array(c, np.float32).reshape(2, 1, 1))
    np.testing.assert_allclose(got.ravel(), want, rtol=1e-6)


def test_plugin_registers_the_qwen3next_vocabulary():
    vocab = build_vocabulary(make_plugin_manager(names=["recurrent"]))
    assert ("mixer", "gated_deltanet") in vocab and ("mixer", "gated_deltanet_tiled") in vocab
    assert ("attention", "gated_causal") in vocab  # an attention op with its own projections, not a mixer


@pytest.mark.parametrize("n,heads,dk,dv", [(1, 1, 2, 3), (7, 4, 16, 8), (3, 2, 1, 1)])
def test_fast_delta_rule_equals_reference(n, heads, dk, dv):
    from archrun_recurrent.deltanet import delta_reference
    from archrun_recurrent.kernels.scan import delta_rule

    q, k = (rng.standard_normal((n, heads, dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((n, heads, dv)).astype(np.float32)
    g = -np.abs(rng.standard_normal((n, heads))).astype(np.float32)
    beta = rng.random((n, heads)).astype(np.float32)
    s0 = rng.standard_normal((heads, dk, dv)).astype(np.float32)
    s1, s2 = s0.copy(), s0.copy()
    np.testing.assert_allclose(delta_rule(s1, q, k, v, g, beta), delta_reference(s2, q, k, v, g, beta),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-5)


def test_reference_delta_rule_is_the_delta_rule():
    """One head, dk = dv = 1: S = e^g S; S += k beta (v - S k); o = S q."""
    from archrun_recurrent.deltanet import delta_reference

    q, k, v, g, beta = [0.5, 2.0], [1.0, -0.5], [3.0, 1.0], [-0.1, -0.7], [0.9, 0.4]
    s, want = 1.5, []
    for t in range(2):
        s *= np.exp(g[t])
        s += k[t] * beta[t] * (v[t] - s * k[t])
        want.append(s * q[t])
    state = np.full((1, 1, 1), 1.5, np.float32)
    arr = [np.array(x, np.float32).reshape(2, 1, 1) for x in (q, k, v)]
    got = delta_reference(state, *arr, np.array(g, np.float32).reshape(2, 1), np.array(beta, np.float32).reshape(2, 1))
    np.testing.assert_allclose(got.ravel(), want, rtol=1e-6)


def test_tiled_value_heads_read_key_head_j_mod_key_heads():
    from archrun_recurrent.deltanet import GatedDeltaNet

    spec = AttentionSpec(kind="gated_deltanet", n_head=6, n_head_kv=6, head_dim=2, v_head_dim=2, scale=1.0,
                         params={"conv_kernel": 2, "key_heads": 2, "split_ba": 1})
    x = np.arange(2 * 2 * 2, dtype=np.float32).reshape(2, 2, 2)       # [n, Hk, dk]
    grouped, tiled = GatedDeltaNet(spec)._to_value_heads(x), GatedDeltaNet(spec, tiled=True)._to_value_heads(x)
    assert [int(grouped[0, j, 0]) for j in range(6)] == [0, 0, 0, 2, 2, 2]
    assert [int(tiled[0, j, 0]) for j in range(6)] == [0, 2, 0, 2, 0, 2]


@pytest.mark.parametrize("n,width,dims", [(1, 3, 4), (9, 16, 8), (4, 1, 1)])
def test_fast_channel_scan_equals_reference(n, width, dims):
    from archrun_recurrent.kernels.scan import channel_scan
    from archrun_recurrent.mamba import scan_reference

    x = rng.standard_normal((n, width)).astype(np.float32)
    dt = np.abs(rng.standard_normal((n, width))).astype(np.float32)
    a = -np.abs(rng.standard_normal((width, dims))).astype(np.float32)
    b, c = (rng.standard_normal((n, dims)).astype(np.float32) for _ in range(2))
    s0 = rng.standard_normal((width, dims)).astype(np.float32)
    s1, s2 = s0.copy(), s0.copy()
    np.testing.assert_allclose(channel_scan(s1, x, dt, a, b, c), scan_reference(s2, x, dt, a, b, c),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op_backend", ["reference", "fast"])
def test_gate_proj_attention_gates_the_output_by_its_own_projection(op_backend):
    """AFMoE's layout: q/k/v as projected, the output projection sees attention * sigmoid(attn_gate h), on
    either backend's gate (numpy's, or the fused layer kernel's element loop)."""
    from archrun_recurrent.gated_attention import GateProjAttentionLayout

    d, heads, hd = 6, 2, 3
    w = {r: rng.normal(size=(d, heads * hd)).astype(np.float32) for r in ("attn_q", "attn_k", "attn_v", "attn_gate")}
    w["attn_output"] = rng.normal(size=(heads * hd, d)).astype(np.float32)

    class Binder:
        def __init__(self):
            self.op_backend = op_backend

        def matrix(self, role, layer):
            return lambda x: x @ w[role]

    spec = AttentionSpec(kind="gated_causal_gate_proj", n_head=heads, n_head_kv=heads, head_dim=hd, v_head_dim=hd,
                         scale=1.0)
    qkv, o = GateProjAttentionLayout().bind(Binder(), spec, 0)
    h = rng.normal(size=(4, d)).astype(np.float32)
    q, k, v = qkv(h)
    np.testing.assert_allclose(q, h @ w["attn_q"], rtol=1e-6)
    a = rng.normal(size=(4, heads * hd)).astype(np.float32)
    want = (a / (1 + np.exp(-(h @ w["attn_gate"])))) @ w["attn_output"]
    np.testing.assert_allclose(o(a), want, rtol=1e-5, atol=1e-6)
    vocab = build_vocabulary(make_plugin_manager(names=["recurrent"]))
    assert ("attention", "gated_causal_gate_proj") in vocab
