"""Mamba (the first selective state-space mixer: Jamba's, Falcon-Mamba's), a token mixer whose memory
is a convolution window and a state per channel.

Per layer, with D = d_inner channels, N state dims, R = dt_rank, K conv taps (llama.cpp
src/models/mamba-base.cpp build_mamba_layer, HF modeling_jamba.py JambaMambaMixer.slow_forward):

    x | z      = ssm_in h                                  [n, D] each
    x          = silu(conv(x) + conv_bias)                 causal depthwise over [state ; x]
    dt | B | C = ssm_x x                                   [n, R], [n, N], [n, N]
    (dt, B, C  = rms(dt) ssm_dt_norm, rms(B) ssm_b_norm, rms(C) ssm_c_norm   when the layer has them: Jamba;
                 rms(dt), rms(B), rms(C) without weights, epsilon 1e-6, when the file says ssm.dt_b_c_rms:
                 Falcon-Mamba, HF's mixer_rms_eps; llama.cpp takes the model's rms epsilon)
    dt         = softplus(ssm_dt dt + ssm_dt_bias)         [n, D]
    S_t        = exp(dt_t A) * S_{t-1} + (dt_t x_t) B_t^T   [D, N]  (A = ssm_a [D, N] < 0)
    y_t        = S_t C_t + ssm_d * x_t
    out        = ssm_out(y * silu(z))
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
WEIGHTLESS_NORM_EPS = 1e-6  # HF FalconMambaConfig.mixer_rms_eps (released configs do not set it)


class MambaLayout:
    """A token mixer's layout (slot "mixer", archrun.vocab.MixerLayout): describe reads the ssm.* keys and
    checks the tensors."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of a Mamba layer (see archrun.vocab.MixerLayout)."""
        m, t, i, d = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd
        taps, inner = m.get("ssm.conv_kernel", int), m.get("ssm.inner_size", int)
        state, rank = m.get("ssm.state_size", int), m.get("ssm.time_step_rank", int)
        if min(taps - 1, inner, state, rank) < 1:
            raise MetadataError(f"Mamba widths are impossible: conv_kernel {taps}, inner_size {inner}, "
                                f"state_size {state}, time_step_rank {rank}")
        t.expect("ssm_in", i, (d, 2 * inner))
        t.expect("ssm_conv1d", i, (taps, inner))
        t.expect("ssm_conv1d.bias", i, (inner,))
        t.expect("ssm_x", i, (inner, rank + 2 * state))
        t.expect("ssm_dt", i, (rank, inner))
        t.expect("ssm_dt.bias", i, (inner,))
        t.expect("ssm_a", i, (state, inner))
        t.expect("ssm_d", i, (inner,))
        t.expect("ssm_out", i, (inner, d))
        norms = t.has("ssm_dt_norm", i)
        if norms:
            t.expect("ssm_dt_norm", i, (rank,))
            t.expect("ssm_b_norm", i, (state,))
            t.expect("ssm_c_norm", i, (state,))
        weightless = not norms and m.get("ssm.dt_b_c_rms", bool, False)
        return {"n_head": inner, "n_head_kv": inner, "head_dim": 1, "v_head_dim": 1,
                "params": {"conv_kernel": taps, "state": state, "dt_rank": rank,
                           "dt_b_c_norms": int(norms) or 2 * int(weightless)}}  # 1: weighted, 2: weightless


def scan_reference(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                   c: np.ndarray) -> np.ndarray:
    """The selective scan, token by token: state [D, N] in place; x/dt [n, D], a [D, N], b/c [n, N] -> y [n, D]."""
    y = np.empty_like(x)
    for t in range(len(x)):
        state *= np.exp(dt[t][:, None] * a)
        state += (dt[t] * x[t])[:, None] * b[t][None, :]
        y[t] = state @ c[t]
    return y


class Mamba:
    """The bound Mamba mixer of one layer: mix(h [n, d], slot, start) -> [n, d]."""

    def __init__(self, spec: Any, scan: Callable[..., np.ndarray] = scan_reference):
        self.taps, self.n_state = int(spec.param("conv_kernel")), int(spec.param("state"))
        self.rank, self.norms = int(spec.param("dt_rank")), int(spec.param("dt_b_c_norms"))
        self.inner = spec.n_head
        self.scan = scan

    def bind(self, binder: Any, layer: int) -> None:
        """Bind the layer's projections, convolution, dt projection, A, D (and dt/B/C norms)."""
        self.in_proj, self.x_proj = binder.matrix("ssm_in", layer), binder.matrix("ssm_x", layer)
        self.conv_w = np.ascontiguousarray(binder.table("ssm_conv1d", layer).reshape(self.inner, self.taps))
        self.conv_b = binder.vector("ssm_conv1d.bias", layer)
        self.dt_proj = binder.matrix("ssm_dt", layer, "ssm_dt.bias")
        self.a = np.ascontiguousarray(binder.table("ssm_a", layer).reshape(self.inner, self.n_state))
        self.d = binder.vector("ssm_d", layer)
        self.out_proj = binder.matrix("ssm_out", layer)
        self.eps = F32(binder.d.norm_eps if self.norms == 1 else WEIGHTLESS_NORM_EPS)
        if self.norms == 1:
            self.norm_w = [binder.vector(r, layer) for r in ("ssm_dt_norm", "ssm_b_norm", "ssm_c_norm")]
        elif self.norms == 2:
            self.norm_w = [F32(1.0)] * 3

    def new_slot(self, capacity: int, max_rewind: int = 64) -> StateSlot:
        """The conv window [K-1, D] and the state [D, N], with copies for the last min(max_rewind, 16) tokens."""
        return StateSlot({"conv": (self.taps - 1, self.inner), "ssm": (self.inner, self.n_state)},
                         recent=min(max_rewind, 16))

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]."""
        slot.begin(start)
        n, di = len(h), self.inner
        xz = self.in_proj(h)                                                  # [n, 2D]
        ext = np.concatenate([slot.state["conv"], xz[:, :di]])                # [K-1+n, D]
        acc = np.broadcast_to(self.conv_b, (n, di)).copy()
        for j in range(self.taps):
            acc += ext[j:j + n] * self.conv_w[:, j]
        x = silu(acc)
        dbc = self.x_proj(x)
        dt, b, c = dbc[:, :self.rank], dbc[:, self.rank:self.rank + self.n_state], dbc[:, self.rank + self.n_state:]
        if self.norms:
            dt, b, c = (self._rms(v, w) for v, w in zip((dt, b, c), self.norm_w, strict=True))
        dt = softplus(self.dt_proj(np.ascontiguousarray(dt)))
        y = self._scan(slot, ext, x, dt, np.ascontiguousarray(b), np.ascontiguousarray(c), start)
        return self.out_proj(((y + x * self.d) * silu(xz[:, di:])).astype(F32))

    def _rms(self, v: np.ndarray, w: np.ndarray) -> np.ndarray:
        return (v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + self.eps) * w).astype(F32)

    def _scan(self, slot: StateSlot, ext, x, dt, b, c, start: int) -> np.ndarray:
        """The scan over the step; the states after its last tokens are kept in the slot's ring."""
        n, end = len(x), start + len(x)
        ssm, conv = slot.state["ssm"], slot.state["conv"]
        first = slot.first_kept(start, end) - start - 1
        y = np.empty_like(x)
        if first > 0:
            y[:first] = self.scan(ssm, x[:first], dt[:first], self.a, b[:first], c[:first])
        for j in range(first, n):
            y[j:j + 1] = self.scan(ssm, x[j:j + 1], dt[j:j + 1], self.a, b[j:j + 1], c[j:j + 1])
            conv[...] = ext[j + 1:j + self.taps]
            slot.keep(start + j + 1)
        slot.end(end)
        return y


def mamba_reference(spec: Any) -> Mamba:
    """The float32 numpy reference (a token-by-token scan)."""
    return Mamba(spec)


class FastMamba(FusedMixer, Mamba):
    """The mixer's steps in numba kernels (archrun_recurrent.kernels.mamba_step), and its whole decode layer as one
    kernel (`fused_layer`, archrun.kernels.decode.fusion.MixerBlock) built from the same inlined steps: a token's
    result has the same bits on either path."""

    _weights: tuple | None = None

    def _token_args(self) -> tuple:
        """The kernels' weights (built on first use, after bind): conv taps [D, K], conv bias, A [D, N], D, the
        dt rank, the dt/B/C norms' weights (empty: none; ones: weightless) and their epsilon."""
        if self._weights is None:
            f32 = (np.ascontiguousarray(v, F32) for v in (self.conv_w, self.conv_b.reshape(-1), self.a,
                                                              self.d.reshape(-1)))
            if self.norms == 1:
                norms = tuple(np.ascontiguousarray(w, F32).reshape(-1) for w in self.norm_w)
            elif self.norms == 2:  # weightless
                norms = tuple(np.ones(k, F32) for k in (self.rank, self.n_state, self.n_state))
            else:
                norms = (np.empty(0, F32),) * 3
            self._weights = (*f32, np.int64(self.rank), *norms, float(self.eps))
        return self._weights

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] at positions start.. to the layer's state; the mixer output [n, d]. The states after
        the step's last tokens are kept in the slot's ring."""
        from archrun_recurrent.kernels import mamba_step as k

        slot.begin(start)
        n, di, end = len(h), self.inner, start + len(h)
        conv_w, conv_b, a, d, rank, w_dt, w_b, w_c, eps = self._token_args()
        xz = self.in_proj(h)                                                  # [n, 2D]
        xin = np.ascontiguousarray(xz[:, :di])
        ext = np.concatenate([slot.state["conv"], xin])                       # [K-1+n, D]: the windows
        x = np.empty((n, di), F32)
        k.conv_tokens(xin, slot.state["conv"].copy(), conv_w, conv_b, x)
        dbc = np.ascontiguousarray(self.x_proj(x), dtype=F32)                 # [n, R + 2N]
        k.dbc_norms(dbc, rank, w_dt, w_b, w_c, eps)
        dt = np.ascontiguousarray(self.dt_proj(np.ascontiguousarray(dbc[:, :rank])), dtype=F32)
        k.softplus_rows(dt)
        z, y = np.ascontiguousarray(xz[:, di:]), np.empty((n, di), F32)
        ssm, conv = slot.state["ssm"], slot.state["conv"]
        first = slot.first_kept(start, end) - start - 1                        # first token whose state is kept
        if first > 0:
            k.scan_tokens(ssm, x[:first], dt[:first], dbc[:first], rank, a, d, z[:first], y[:first])
        for j in range(first, n):
            k.scan_tokens(ssm, x[j:j + 1], dt[j:j + 1], dbc[j:j + 1], rank, a, d, z[j:j + 1], y[j:j + 1])
            conv[...] = ext[j + 1:j + self.taps]
            slot.keep(start + j + 1)
        slot.end(end)
        return self.out_proj(y)

    def _fused_parts(self) -> tuple:
        from archrun_recurrent.kernels.mamba_step import mamba_layer

        return mamba_layer, (self.in_proj, self.x_proj, self.dt_proj, self.out_proj), self._token_args()


def mamba_fast(spec: Any) -> Mamba:
    """The same mixer in numba kernels; its layer decodes fused."""
    return FastMamba(spec)
