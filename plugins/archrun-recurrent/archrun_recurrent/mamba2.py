"""Mamba2's selective state-space mixer (SSD), a token mixer whose memory is a convolution window
and a state per head.

Per layer, with d_inner = H * P (H heads of P channels), G groups of N state dims, K conv taps,
conv_dim = d_inner + 2 G N (llama.cpp src/models/mamba-base.cpp build_mamba2_layer, HF
modeling_mamba2.py Mamba2Mixer.torch_forward):

    z | xBC | dt = ssm_in h                          [n, d_inner], [n, conv_dim], [n, H]
    xBC          = silu(conv(xBC) + conv_bias)       causal depthwise convolution over [state ; xBC]
    x | B | C    = xBC                               [n, H, P], [n, G, N], [n, G, N] (head h reads group h // (H/G))
    dt           = softplus(dt + dt_bias)            [n, H]
    S_t          = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T   [H, P, N]   (A = ssm_a < 0, one per head)
    y_t          = S_t C_t + D x_t                   [H, P]
    out          = ssm_out(grouped_rms(y * silu(z)) * ssm_norm)   (RMS over each group's d_inner/G channels;
                                                                   ssm_out(y * silu(z)) without ssm_norm: Falcon-H1)

The state is (the conv window [K-1, conv_dim], S [H, P, N]); decode is O(1) in the context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from archrun.errors import MetadataError
from archrun_recurrent.fused import FusedMixer
from archrun_recurrent.state import StateSlot

F32 = np.float32


class Mamba2Layout:
    """A token mixer's layout (slot "mixer", archrun.vocab.MixerLayout): describe reads the ssm.* keys and
    checks the tensors."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of a Mamba2 layer (see archrun.vocab.MixerLayout)."""
        m, t, i, d = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd
        taps, inner = m.get("ssm.conv_kernel", int), m.get("ssm.inner_size", int)
        state, heads = m.get("ssm.state_size", int), m.get("ssm.time_step_rank", int)
        groups = m.get("ssm.group_count", int, 1) or 1
        if min(taps - 1, inner, state, heads, groups) < 1 or inner % heads or heads % groups:
            raise MetadataError(f"Mamba2 widths are impossible: conv_kernel {taps}, inner_size {inner}, "
                                f"state_size {state}, heads {heads}, groups {groups}")
        conv_dim = inner + 2 * groups * state
        t.expect("ssm_in", i, (d, inner + conv_dim + heads))
        t.expect("ssm_conv1d", i, (taps, conv_dim))
        t.expect("ssm_conv1d.bias", i, (conv_dim,))
        t.expect("ssm_dt.bias", i, (heads,))
        t.expect("ssm_a", i, (1, heads))
        t.expect("ssm_d", i, (1, heads))
        norm = t.has("ssm_norm", i)
        if norm:
            t.expect("ssm_norm", i, (inner // groups, groups))
        t.expect("ssm_out", i, (inner, d))
        head_dim = inner // heads
        return {"n_head": heads, "n_head_kv": heads, "head_dim": head_dim, "v_head_dim": head_dim,
                "params": {"conv_kernel": taps, "inner": inner, "state": state, "groups": groups,
                           "gated_norm": int(norm)}}


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), overflow-safe (torch's softplus with threshold 20 agrees within float32)."""
    return np.logaddexp(x, 0.0).astype(F32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x / (1.0 + np.exp(-x))).astype(F32)


def scan_reference(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                   c: np.ndarray) -> np.ndarray:
    """The selective scan, token by token: state [H, P, N] updated in place; x [n, H, P], dt [n, H],
    a [H], b/c [n, H, N] -> y [n, H, P] (without the D term)."""
    y = np.empty_like(x)
    for t in range(len(x)):
        decay = np.exp(dt[t] * a)                                             # [H]
        state *= decay[:, None, None]
        state += (dt[t][:, None] * x[t])[:, :, None] * b[t][:, None, :]        # [H, P, N]
        y[t] = np.einsum("hpn,hn->hp", state, c[t])
    return y


class Mamba2:
    """The bound Mamba2 mixer of one layer: mix(h [n, d], slot, start) -> [n, d]."""

    def __init__(self, spec: Any, scan: Callable[..., np.ndarray] = scan_reference, eps: float = 1e-5):
        self.taps, self.inner = int(spec.param("conv_kernel")), int(spec.param("inner"))
        self.n_state, self.groups = int(spec.param("state")), int(spec.param("groups"))
        self.heads, self.head_dim = spec.n_head, spec.head_dim
        self.conv_dim = self.inner + 2 * self.groups * self.n_state
        self.scan, self.eps = scan, eps
        self.gated_norm = bool(spec.param("gated_norm"))

    def bind(self, binder: Any, layer: int) -> None:
        """Bind the layer's projections, convolution, dt bias, A, D and gated-norm weights (once, at load)."""
        self.in_proj = binder.matrix("ssm_in", layer)
        self.conv_w = np.ascontiguousarray(binder.table("ssm_conv1d", layer).reshape(self.conv_dim, self.taps))
        self.conv_b = binder.vector("ssm_conv1d.bias", layer)
        self.dt_bias = binder.vector("ssm_dt.bias", layer)
        self.a, self.d = binder.vector("ssm_a", layer), binder.vector("ssm_d", layer)
        self.norm_w = binder.vector("ssm_norm", layer) if self.gated_norm else None   # [d_inner]
        self.out_proj = binder.matrix("ssm_out", layer)
        self.eps = float(binder.d.norm_eps)

    def new_slot(self, capacity: int, max_rewind: int = 64) -> StateSlot:
        """The conv window [K-1, conv_dim] and the state (_ssm_shape), with copies for the last
        min(max_rewind, 16) tokens (each copy costs a state: the reach speculative decoding needs)."""
        return StateSlot({"conv": (self.taps - 1, self.conv_dim), "ssm": self._ssm_shape()},
                         recent=min(max_rewind, 16))

    def _ssm_shape(self) -> tuple[int, int, int]:
        """The state's stored shape: [H, P, N], as the math writes it."""
        return (self.heads, self.head_dim, self.n_state)

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]."""
        slot.begin(start)
        n, di = len(h), self.inner
        zxbcdt = self.in_proj(h)                                               # [n, d_in_proj]
        ext = np.concatenate([slot.state["conv"], zxbcdt[:, di:di + self.conv_dim]])   # [K-1+n, conv_dim]
        xbc = self._conv(ext, n)
        x = xbc[:, :di].reshape(n, self.heads, self.head_dim)
        gn = self.groups * self.n_state
        b, c = self._per_head(xbc[:, di:di + gn]), self._per_head(xbc[:, di + gn:])
        dt = softplus(zxbcdt[:, di + self.conv_dim:] + self.dt_bias)           # [n, H]
        y = self._scan(slot, ext, x, dt, b, c, start)
        y = (y + x * self.d[:, None]).reshape(n, di) * silu(zxbcdt[:, :di])
        return self.out_proj(self._group_norm(y) if self.gated_norm else y.astype(F32))

    def _conv(self, ext: np.ndarray, n: int) -> np.ndarray:
        acc = np.broadcast_to(self.conv_b, (n, self.conv_dim)).copy()
        for j in range(self.taps):
            acc += ext[j:j + n] * self.conv_w[:, j]
        return silu(acc)

    def _per_head(self, v: np.ndarray) -> np.ndarray:
        """[n, G*N] -> [n, H, N]: head h reads group h // (H / G)."""
        return np.repeat(v.reshape(len(v), self.groups, self.n_state), self.heads // self.groups, axis=1)

    def _scan(self, slot: StateSlot, ext, x, dt, b, c, start: int) -> np.ndarray:
        """The scan over the step; the states after its last tokens are kept in the slot's ring."""
        n, end = len(x), start + len(x)
        ssm, conv = slot.state["ssm"], slot.state["conv"]
        first = slot.first_kept(start, end) - start - 1                        # first token whose state is kept
        y = np.empty_like(x)
        if first > 0:
            y[:first] = self.scan(ssm, x[:first], dt[:first], self.a, b[:first], c[:first])
        for j in range(first, n):
            y[j:j + 1] = self.scan(ssm, x[j:j + 1], dt[j:j + 1], self.a, b[j:j + 1], c[j:j + 1])
            conv[...] = ext[j + 1:j + self.taps]
            slot.keep(start + j + 1)
        slot.end(end)
        return y

    def _group_norm(self, y: np.ndarray) -> np.ndarray:
        """RMS norm over each group's d_inner/G channels, times ssm_norm."""
        g = y.reshape(len(y), self.groups, -1)
        g = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + F32(self.eps))
        return (g.reshape(y.shape) * self.norm_w).astype(F32)


def mamba2_reference(spec: Any) -> Mamba2:
    """The float32 numpy reference (a token-by-token scan)."""
    return Mamba2(spec)


class FastMamba2(FusedMixer, Mamba2):
    """The mixer token by token in numba kernels (archrun_recurrent.kernels.mamba2_step), and its whole decode
    layer as one kernel (`fused_layer`, archrun.kernels.decode.fusion.MixerBlock) built from the same token
    step: a token's result has the same bits on either path."""

    _args: tuple | None = None

    def _ssm_shape(self) -> tuple[int, int, int]:
        """[H, N, P]: state dimension major, so the token kernel's vector loops run over a head's channels
        (mamba2_step.mamba2_token)."""
        return (self.heads, self.n_state, self.head_dim)

    def _token_args(self) -> tuple:
        """The token kernel's weights (built on first use, after bind): conv taps [conv_dim, K], conv bias, dt
        bias, A, D (float32 [H]), the gated norm's weight (empty: none), groups, epsilon."""
        if self._args is None:
            vecs = (np.ascontiguousarray(v, F32).reshape(-1) for v in (self.conv_b, self.dt_bias, self.a, self.d))
            norm = np.ascontiguousarray(self.norm_w, F32).reshape(-1) if self.norm_w is not None else np.empty(0, F32)
            self._args = (np.ascontiguousarray(self.conv_w, F32), *vecs, norm, np.int64(self.groups), float(self.eps))
        return self._args

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]. The states after
        the step's last tokens are kept in the slot's ring."""
        from archrun_recurrent.kernels.mamba2_step import mamba2_tokens

        slot.begin(start)
        n, end = len(h), start + len(h)
        zxbcdt = np.ascontiguousarray(self.in_proj(h), dtype=F32)               # [n, d_in_proj]
        y = np.empty((n, self.inner), F32)
        conv, ssm = slot.state["conv"], slot.state["ssm"]
        args = self._token_args()
        first = slot.first_kept(start, end) - start - 1                        # first token whose state is kept
        if first > 0:
            mamba2_tokens(zxbcdt[:first], conv, ssm, *args, y[:first])
        for j in range(first, n):
            mamba2_tokens(zxbcdt[j:j + 1], conv, ssm, *args, y[j:j + 1])
            slot.keep(start + j + 1)
        slot.end(end)
        return self.out_proj(y)

    def _fused_parts(self) -> tuple:
        from archrun_recurrent.kernels.mamba2_step import mamba2_layer

        return mamba2_layer, (self.in_proj, self.out_proj), self._token_args()

    def _beside_parts(self) -> tuple:
        from archrun_recurrent.kernels.mamba2_step import mamba2_beside_layer

        return mamba2_beside_layer, (self.in_proj, self.out_proj), self._token_args()


def mamba2_fast(spec: Any) -> Mamba2:
    """The same mixer token by token in numba kernels; its layer decodes fused."""
    return FastMamba2(spec)
