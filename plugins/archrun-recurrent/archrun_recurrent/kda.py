"""Kimi Delta Attention (KDA, Kimi Linear's linear-attention layers): gated DeltaNet whose decay is per key
channel, not per head.

Per layer, with H heads of width dk (= dv), K conv taps, inner = H dk (llama.cpp src/models/kimi-linear.cpp,
HF modeling_kimi_linear.py KimiLinearDeltaAttention):

    q, k, v = silu(conv_q(attn_q h)), silu(conv_k(attn_k h)), silu(conv_v(attn_v h))   causal depthwise, no bias
    q, k = l2norm(q), l2norm(k)  [n, H, dk]
    beta = sigmoid(ssm_beta h)                                  [n, H]
    g    = ssm_a * softplus(ssm_f_b(ssm_f_a h) + ssm_dt.bias)   [n, H, dk]  (ssm_a = -exp(A_log), per head)
    S_t  = diag(exp(g_t)) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T       [H, dk, dv]
    o_t  = S_t^T q_t / sqrt(dk)
    out  = attn_output(rms(o) * ssm_norm * sigmoid(ssm_g_b(ssm_g_a h)))   (the norm per head, weight [dk];
                                                                            or a full-rank attn_gate h)

The state, its rewind copies and the token loop are gated DeltaNet's (archrun_recurrent.deltanet); the delta
rule takes a [n, H, dk] decay (deltanet.delta_reference, kernels.scan.delta_rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from archrun.errors import MetadataError
from archrun_recurrent.deltanet import GatedDeltaNet, delta_reference, l2norm
from archrun_recurrent.fused import FusedMixer
from archrun_recurrent.mamba2 import silu, softplus

F32 = np.float32
CONVS = ("ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v")


class KdaLayout:
    """A token mixer's layout (slot "mixer"): describe reads ssm.conv_kernel, kda.head_dim and the layer's
    head count, and checks the tensors."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """Spec fields of a KDA layer (see archrun.vocab.MixerLayout)."""
        m, t, i, d = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd
        taps, dk, heads = m.get("ssm.conv_kernel", int), m.get("kda.head_dim", int), ctx.n_head
        if min(taps - 1, dk, heads) < 1:
            raise MetadataError(f"KDA widths are impossible: conv_kernel {taps}, kda.head_dim {dk}, heads {heads}")
        inner = heads * dk
        for role in ("attn_q", "attn_k", "attn_v"):
            t.expect(role, i, (d, inner))
        for role in CONVS:
            t.expect(role, i, (taps, 1, inner))
        t.expect("ssm_f_a", i, (d, dk))
        t.expect("ssm_f_b", i, (dk, inner))
        t.expect("ssm_beta", i, (d, heads))
        t.expect("ssm_a", i, (1, heads))
        t.expect("ssm_dt.bias", i, (inner,))
        full_gate = t.has("attn_gate", i)
        if full_gate:
            t.expect("attn_gate", i, (d, inner))
        else:
            t.expect("ssm_g_a", i, (d, dk))
            t.expect("ssm_g_b", i, (dk, inner))
        t.expect("ssm_norm", i, (dk,))
        t.expect("attn_output", i, (inner, d))
        return {"n_head": heads, "n_head_kv": heads, "head_dim": dk, "v_head_dim": dk, "scale": 1.0 / np.sqrt(dk),
                "params": {"conv_kernel": taps, "full_gate": int(full_gate)}}


class _LowRank:
    """b(a(h)): a rank-dk projection [n, d] -> [n, inner]."""

    def __init__(self, a: Any, b: Any):
        self.a, self.b = a, b

    def __call__(self, h: np.ndarray) -> np.ndarray:
        return self.b(self.a(h))


class KimiDeltaAttention(GatedDeltaNet):
    """The bound KDA mixer of one layer: mix(h [n, d], slot, start) -> [n, d] (gated DeltaNet's state and
    token loop, KDA's projections and per-channel decay)."""

    def __init__(self, spec: Any, rule: Callable[..., np.ndarray] = delta_reference):
        self.taps, self.full_gate = int(spec.param("conv_kernel")), bool(spec.param("full_gate"))
        self.hk = self.hv = spec.n_head
        self.dk = self.dv = spec.head_dim
        self.scale = F32(spec.scale)
        self.inner = self.hv * self.dk
        self.conv_dim = 3 * self.inner
        self.rule = rule

    def bind(self, binder: Any, layer: int) -> None:
        """Bind the layer's projections, convolutions, gates and norm (once, at load)."""
        self.q, self.k, self.v = (binder.matrix(r, layer) for r in ("attn_q", "attn_k", "attn_v"))
        self.conv_w = np.ascontiguousarray(np.concatenate(
            [binder.table(r, layer).reshape(self.inner, self.taps) for r in CONVS]), dtype=F32)
        self.decay = _LowRank(binder.matrix("ssm_f_a", layer), binder.matrix("ssm_f_b", layer))
        self.beta_proj = binder.matrix("ssm_beta", layer)
        self.a = np.ascontiguousarray(binder.table("ssm_a", layer).reshape(self.hv, 1), dtype=F32)
        self.dt_bias = binder.vector("ssm_dt.bias", layer)
        self.gate = (binder.matrix("attn_gate", layer) if self.full_gate else
                     _LowRank(binder.matrix("ssm_g_a", layer), binder.matrix("ssm_g_b", layer)))
        self.norm_w = binder.vector("ssm_norm", layer)
        self.out_proj = binder.matrix("attn_output", layer)
        self.eps = float(binder.d.norm_eps)

    def mix(self, h: np.ndarray, slot: Any, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]."""
        slot.begin(start)
        n, inner, shape = len(h), self.inner, (len(h), self.hv, self.dk)
        ext = np.concatenate([slot.state["conv"], np.concatenate([self.q(h), self.k(h), self.v(h)], axis=1)])
        acc = np.zeros((n, self.conv_dim), F32)
        for j in range(self.taps):
            acc += ext[j:j + n] * self.conv_w[:, j]
        mixed = silu(acc)
        q = l2norm(mixed[:, :inner].reshape(shape), 1e-6) * self.scale
        k = l2norm(mixed[:, inner:2 * inner].reshape(shape), 1e-6)
        v = np.ascontiguousarray(mixed[:, 2 * inner:].reshape(shape))
        beta = (1.0 / (1.0 + np.exp(-self.beta_proj(h)))).astype(F32)
        g = (softplus(self.decay(h) + self.dt_bias).reshape(shape) * self.a).astype(F32)
        o = self._run(slot, ext, q.astype(F32), k, v, g, beta, start)
        o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + F32(self.eps)) * self.norm_w
        o = o / (1.0 + np.exp(-self.gate(h).reshape(shape)))
        return self.out_proj(o.reshape(n, inner).astype(F32))


def kda_reference(spec: Any) -> KimiDeltaAttention:
    """The float32 numpy reference (a token-by-token delta rule)."""
    return KimiDeltaAttention(spec)


class FastKda(FusedMixer, KimiDeltaAttention):
    """The mixer token by token in numba kernels (archrun_recurrent.kernels.delta_step), and its whole decode layer
    as one kernel (`fused_layer`, archrun.kernels.decode.fusion.MixerBlock; with a dense FFN or a mixture of
    experts) built from the same token step: a token's result has the same bits on either path."""

    _args: tuple | None = None

    def _token_args(self) -> tuple:
        """The token kernel's weights (built on first use, after bind): conv taps [3 inner, K], a zero conv bias,
        dt bias [inner], A [H], the norm's weight [dk], the q scale, the norm's epsilon."""
        if self._args is None:
            vecs = (np.ascontiguousarray(v, F32).reshape(-1) for v in (self.dt_bias, self.a, self.norm_w))
            self._args = (np.ascontiguousarray(self.conv_w, F32), np.zeros(self.conv_dim, F32), *vecs,
                          F32(self.scale), float(self.eps))
        return self._args

    def mix(self, h: np.ndarray, slot: Any, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]. The states after
        the step's last tokens are kept in the slot's ring."""
        from archrun_recurrent.kernels.delta_step import kda_tokens

        slot.begin(start)
        n, end = len(h), start + len(h)
        qkv = np.ascontiguousarray(np.concatenate([self.q(h), self.k(h), self.v(h)], axis=1), dtype=F32)
        f, b, gate = (np.ascontiguousarray(p(h), dtype=F32) for p in (self.decay, self.beta_proj, self.gate))
        y = np.empty((n, self.inner), F32)
        conv, state = slot.state["conv"], slot.state["delta"]
        args = self._token_args()
        first = slot.first_kept(start, end) - start - 1                        # first token whose state is kept
        if first > 0:
            kda_tokens(qkv[:first], f[:first], b[:first], gate[:first], conv, state, *args, y[:first])
        for j in range(first, n):
            kda_tokens(qkv[j:j + 1], f[j:j + 1], b[j:j + 1], gate[j:j + 1], conv, state, *args, y[j:j + 1])
            slot.keep(start + j + 1)
        slot.end(end)
        return self.out_proj(y)

    def _fused_parts(self) -> tuple:
        from archrun_recurrent.kernels.delta_step import kda_layer

        conv_w, conv_b, dt_bias, a, norm_w, scale, eps = self._token_args()
        if self.full_gate:
            low, g_b = (self.decay.a, self.beta_proj, self.gate), ()
        else:
            low, g_b = (self.decay.a, self.beta_proj, self.gate.a), (self.gate.b,)
        mats = ((self.q, self.k, self.v), low, (self.decay.b,), g_b, self.out_proj)
        return kda_layer, mats, (conv_w, conv_b, dt_bias, a, norm_w, np.int64(self.full_gate), scale, eps)


def kda_fast(spec: Any) -> KimiDeltaAttention:
    """The same mixer token by token in numba kernels; its layer decodes fused."""
    return FastKda(spec)
