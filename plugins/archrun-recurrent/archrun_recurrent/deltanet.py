"""Gated DeltaNet (Qwen3-Next's linear-attention layers): a token mixer whose memory is a
convolution window and a key x value state per head, updated by the delta rule.

Per layer, with Hk key heads of width dk, Hv value heads of width dv (r = Hv / Hk value heads read
each key head), K conv taps, conv_dim = 2 Hk dk + Hv dv (llama.cpp src/models/qwen3next.cpp
build_layer_attn_linear, HF modeling_qwen3_next.py Qwen3NextGatedDeltaNet):

    qkv = attn_qkv h;  z = attn_gate h;  b | a = ssm_ba h     (b, a interleaved per key head: [Hk, 2r];
                                                               or b = ssm_beta h, a = ssm_alpha h: Qwen3.5)
    qkv = silu(conv(qkv))                                      causal depthwise, no bias
    q, k = l2norm(q), l2norm(k) [n, Hk, dk], repeated to Hv heads: value head j reads key head j // r
           ("gated_deltanet", grouped as HF stores them) or j % Hk ("gated_deltanet_tiled": Qwen3.5 files,
           whose converter reorders every value-head tensor so)
    beta = sigmoid(b);  g = softplus(a + dt_bias) * A          [n, Hv]  (A = ssm_a = -exp(A_log))
    S_t  = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T      [Hv, dk, dv]
    o_t  = S_t^T q_t / sqrt(dk)                                [Hv, dv]
    out  = ssm_out(rms(o) * ssm_norm * silu(z))                (the norm per value head, weight [dv])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from archrun.errors import MetadataError
from archrun_recurrent.fused import FusedMixer
from archrun_recurrent.mamba2 import silu, softplus
from archrun_recurrent.state import StateSlot

F32 = np.float32


class DeltaNetLayout:
    """A token mixer's layout (slot "mixer", archrun.vocab.MixerLayout): describe reads the ssm.* keys and
    checks the tensors."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of a gated DeltaNet layer (see archrun.vocab.MixerLayout)."""
        m, t, i, d = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd
        taps, dk = m.get("ssm.conv_kernel", int), m.get("ssm.state_size", int)
        hk, hv = m.get("ssm.group_count", int), m.get("ssm.time_step_rank", int)
        inner = m.get("ssm.inner_size", int)
        if min(taps - 1, dk, hk, hv, inner) < 1 or hv % hk or inner % hv:
            raise MetadataError(f"gated DeltaNet widths are impossible: conv_kernel {taps}, state_size {dk}, "
                                f"key heads {hk}, value heads {hv}, inner_size {inner}")
        dv = inner // hv
        conv_dim = 2 * hk * dk + hv * dv
        t.expect("attn_qkv", i, (d, conv_dim))
        t.expect("attn_gate", i, (d, hv * dv))
        split = not t.has("ssm_ba", i)
        if split:
            t.expect("ssm_beta", i, (d, hv))
            t.expect("ssm_alpha", i, (d, hv))
        else:
            t.expect("ssm_ba", i, (d, 2 * hv))
        t.expect("ssm_conv1d", i, (taps, conv_dim))
        t.expect("ssm_dt.bias", i, (hv,))
        t.expect("ssm_a", i, (hv,))
        t.expect("ssm_norm", i, (dv,))
        t.expect("ssm_out", i, (hv * dv, d))
        return {"n_head": hv, "n_head_kv": hv, "head_dim": dk, "v_head_dim": dv, "scale": 1.0 / np.sqrt(dk),
                "params": {"conv_kernel": taps, "key_heads": hk, "split_ba": int(split)}}


def l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis."""
    return (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(eps))).astype(F32)


def delta_reference(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                    beta: np.ndarray) -> np.ndarray:
    """The gated delta rule, token by token: state [H, dk, dv] in place; q/k [n, H, dk] (q scaled),
    v [n, H, dv], beta [n, H], g [n, H] (a head's log decay) or [n, H, dk] (each key channel's: KDA)
    -> o [n, H, dv]."""
    o = np.empty_like(v)
    for t in range(len(q)):
        state *= np.exp(g[t]).reshape(len(state), -1, 1)
        kv = np.einsum("hkv,hk->hv", state, k[t])                            # [H, dv]
        delta = (v[t] - kv) * beta[t][:, None]
        state += k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hkv,hk->hv", state, q[t])
    return o


class GatedDeltaNet:
    """The bound gated DeltaNet mixer of one layer: mix(h [n, d], slot, start) -> [n, d]."""

    def __init__(self, spec: Any, rule: Callable[..., np.ndarray] = delta_reference, tiled: bool = False):
        self.taps, self.hk = int(spec.param("conv_kernel")), int(spec.param("key_heads"))
        self.split, self.tiled = bool(spec.param("split_ba")), tiled
        self.hv, self.dk, self.dv = spec.n_head, spec.head_dim, spec.v_head_dim
        self.scale = F32(spec.scale)
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.rule = rule

    def bind(self, binder: Any, layer: int) -> None:
        """Bind the layer's projections, convolution, gates and norm (once, at load)."""
        self.qkv, self.gate = binder.matrix("attn_qkv", layer), binder.matrix("attn_gate", layer)
        if self.split:
            self.beta_proj, self.alpha_proj = binder.matrix("ssm_beta", layer), binder.matrix("ssm_alpha", layer)
        else:
            self.ba = binder.matrix("ssm_ba", layer)
        self.conv_w = np.ascontiguousarray(binder.table("ssm_conv1d", layer).reshape(self.conv_dim, self.taps))
        self.dt_bias, self.a = binder.vector("ssm_dt.bias", layer), binder.vector("ssm_a", layer)
        self.norm_w = binder.vector("ssm_norm", layer)
        self.out_proj = binder.matrix("ssm_out", layer)
        self.eps = float(binder.d.norm_eps)

    def new_slot(self, capacity: int, max_rewind: int = 64) -> StateSlot:
        """The conv window [K-1, conv_dim] and the state [Hv, dk, dv], with copies for the last
        min(max_rewind, 16) tokens."""
        return StateSlot({"conv": (self.taps - 1, self.conv_dim), "delta": (self.hv, self.dk, self.dv)},
                         recent=min(max_rewind, 16))

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]."""
        slot.begin(start)
        n, kd = len(h), self.hk * self.dk
        ext = np.concatenate([slot.state["conv"], self.qkv(h)])              # [K-1+n, conv_dim]
        acc = np.zeros((n, self.conv_dim), F32)
        for j in range(self.taps):
            acc += ext[j:j + n] * self.conv_w[:, j]
        mixed = silu(acc)
        q = self._to_value_heads(l2norm(mixed[:, :kd].reshape(n, self.hk, self.dk), 1e-6)) * self.scale
        k = self._to_value_heads(l2norm(mixed[:, kd:2 * kd].reshape(n, self.hk, self.dk), 1e-6))
        v = np.ascontiguousarray(mixed[:, 2 * kd:].reshape(n, self.hv, self.dv))
        b, a = self._beta_alpha(h)
        beta = 1.0 / (1.0 + np.exp(-b))
        g = softplus(a + self.dt_bias) * self.a
        o = self._run(slot, ext, q.astype(F32), k.astype(F32), v, g.astype(F32), beta.astype(F32), start)
        o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + F32(self.eps)) * self.norm_w
        o = o * silu(self.gate(h).reshape(n, self.hv, self.dv))
        return self.out_proj(o.reshape(n, self.hv * self.dv).astype(F32))

    def _to_value_heads(self, x: np.ndarray) -> np.ndarray:
        """[n, Hk, dk] -> [n, Hv, dk]: grouped (j // r) or tiled (j % Hk) value heads."""
        r = self.hv // self.hk
        return np.tile(x, (1, r, 1)) if self.tiled else np.repeat(x, r, axis=1)

    def _beta_alpha(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pre-activation beta and alpha gates [n, Hv] each."""
        if self.split:
            return self.beta_proj(h), self.alpha_proj(h)
        r, n = self.hv // self.hk, len(h)
        ba = self.ba(h).reshape(n, self.hk, 2 * r)                           # per key head [b (r) | a (r)]
        return ba[:, :, :r].reshape(n, self.hv), ba[:, :, r:].reshape(n, self.hv)

    def _run(self, slot: StateSlot, ext, q, k, v, g, beta, start: int) -> np.ndarray:
        """The delta rule over the step; the states after its last tokens are kept in the slot's ring."""
        n, end = len(q), start + len(q)
        state, conv = slot.state["delta"], slot.state["conv"]
        first = slot.first_kept(start, end) - start - 1
        o = np.empty_like(v)
        if first > 0:
            o[:first] = self.rule(state, q[:first], k[:first], v[:first], g[:first], beta[:first])
        for j in range(first, n):
            o[j:j + 1] = self.rule(state, q[j:j + 1], k[j:j + 1], v[j:j + 1], g[j:j + 1], beta[j:j + 1])
            conv[...] = ext[j + 1:j + self.taps]
            slot.keep(start + j + 1)
        slot.end(end)
        return o


def deltanet_reference(spec: Any) -> GatedDeltaNet:
    """The float32 numpy reference (a token-by-token delta rule)."""
    return GatedDeltaNet(spec)


class FastGatedDeltaNet(FusedMixer, GatedDeltaNet):
    """The mixer token by token in numba kernels (archrun_recurrent.kernels.delta_step), and its whole decode layer
    as one kernel (`fused_layer`, archrun.kernels.decode.fusion.MixerBlock; with a dense FFN or a mixture of
    experts) built from the same token step: a token's result has the same bits on either path."""

    _args: tuple | None = None

    def _token_args(self) -> tuple:
        """The token kernel's weights (built on first use, after bind): conv taps [conv_dim, K], a zero conv bias,
        dt bias, A (float32 [Hv]), the norm's weight [dv], Hk, tiled, split, the q scale, the norm's epsilon."""
        if self._args is None:
            vecs = (np.ascontiguousarray(v, F32).reshape(-1) for v in (self.dt_bias, self.a, self.norm_w))
            self._args = (np.ascontiguousarray(self.conv_w, F32), np.zeros(self.conv_dim, F32), *vecs,
                          np.int64(self.hk), np.int64(self.tiled), np.int64(self.split), F32(self.scale),
                          float(self.eps))
        return self._args

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]. The states after
        the step's last tokens are kept in the slot's ring."""
        from archrun_recurrent.kernels.delta_step import deltanet_tokens

        slot.begin(start)
        n, end = len(h), start + len(h)
        qkv = np.ascontiguousarray(self.qkv(h), dtype=F32)                    # [n, conv_dim]
        z = np.ascontiguousarray(self.gate(h), dtype=F32)                     # [n, Hv dv]
        ba = np.concatenate([self.beta_proj(h), self.alpha_proj(h)], axis=1) if self.split else self.ba(h)
        ba = np.ascontiguousarray(ba, dtype=F32)                              # [n, 2 Hv]
        y = np.empty((n, self.hv * self.dv), F32)
        conv, state = slot.state["conv"], slot.state["delta"]
        args = self._token_args()
        first = slot.first_kept(start, end) - start - 1                        # first token whose state is kept
        if first > 0:
            deltanet_tokens(qkv[:first], z[:first], ba[:first], conv, state, *args, y[:first])
        for j in range(first, n):
            deltanet_tokens(qkv[j:j + 1], z[j:j + 1], ba[j:j + 1], conv, state, *args, y[j:j + 1])
            slot.keep(start + j + 1)
        slot.end(end)
        return self.out_proj(y)

    def _fused_parts(self) -> tuple:
        from archrun_recurrent.kernels.delta_step import deltanet_layer

        ba = (self.beta_proj, self.alpha_proj) if self.split else self.ba
        return deltanet_layer, ((self.qkv, self.gate), ba, self.out_proj), self._token_args()


def deltanet_fast(spec: Any, tiled: bool = False) -> GatedDeltaNet:
    """The same mixer token by token in numba kernels; its layer decodes fused."""
    return FastGatedDeltaNet(spec, tiled=tiled)


def tiled_reference(spec: Any) -> GatedDeltaNet:
    """The reference mixer with tiled value heads (value head j reads key head j % Hk)."""
    return GatedDeltaNet(spec, tiled=True)


def tiled_fast(spec: Any) -> GatedDeltaNet:
    """The fast mixer with tiled value heads."""
    return deltanet_fast(spec, tiled=True)
