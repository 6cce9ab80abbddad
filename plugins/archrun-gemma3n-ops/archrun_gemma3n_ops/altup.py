"""Gemma 3n's residual streams: AltUp (several parallel streams, one of which the blocks run on) and the
per-layer inputs — the stream op "altup" (archrun.vocab, slot "stream").

HF Gemma3nTextModel / Gemma3nTextAltUp / Gemma3nTextDecoderLayer, llama.cpp gemma3n-iswa.cpp. S streams
(`altup.num_inputs`), the active one a (`altup.active_idx`), L blocks, d the model width, p the per-layer
input width (`embedding_length_per_layer_input`); rms(v) = sqrt(mean(v^2)) over the last axis.

enter(x = the scaled embeddings, ids):
    per-layer inputs P [n, L, p] and each layer's term_i (archrun_gemma4_ops.per_layer: Gemma 4's E2B/E4B
                                    have the same)
    streams X_0 = x, X_k = Y_k rms(x) / max(rms(Y_k), sqrt(1e-5)), Y_k = altup_proj[k-1] x   (k = 1..S-1)
layer(i, X, block):
    m(v)   = tanh((norm(v, altup_router_norm) / d) altup_router)                 the router  [n, S]
    pred_j = X_j + sum_k C[j, k] X_k,  C = altup_predict_coef m(X_a) as [S, S]    predict
    o      = block(pred_a)                                                        the block on the active one
    X'_j   = pred_j + (altup_correct_coef m(o) + 1)_j (o - pred_a)                correct
    X'_j  += term_i(X'_a altup_correct_scale) for j = 1..S-1                      the per-layer input
leave(X):
    mean of X_0 and Z_k = U_k rms(X_0) / max(rms(U_k), sqrt(1e-5)), U_k = altup_unembd_proj[k-1] X_k
    (then the model's final norm). llama.cpp merges with the active stream's magnitude and without the
    1e-5 floor (the same for active_idx 0 and for any stream of non-negligible size).

The stacked [S-1, d, d] projections are small float tables. Released models' per-layer token table covers
the text vocabulary (262144 of 262400 ids); the converter pads it with zero rows for the multimodal ids,
which read those zeros here as in llama.cpp (HF's text model maps them to row 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from archrun.errors import MetadataError
from archrun_gemma4_ops.per_layer import PerLayerInputs, expect_tensors

F32 = np.float32
FLOOR = F32(1e-5)  # HF clamps the mean square of a projected stream at 1e-5 before its square root


class AltupLayout:
    """{"params": {n_inputs, active, per_layer_width}} from the file's keys (archrun.vocab.StreamLayout)."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        m, t, d = ctx.meta, ctx.tensors, ctx.n_embd
        n_in = m.get("altup.num_inputs", int)
        active = m.get("altup.active_idx", int, 0)
        width = m.get("embedding_length_per_layer_input", int)
        n_layer = m.get("block_count", int)
        if n_in < 2 or not 0 <= active < n_in or width < 1:
            raise MetadataError(f"stream 'altup' needs at least 2 streams, an active one among them and a per-layer "
                                f"input width: {m.key('altup.num_inputs')} = {n_in}, {m.key('altup.active_idx')} = "
                                f"{active}, {m.key('embedding_length_per_layer_input')} = {width}")
        t.expect("altup_proj", None, (d, d, n_in - 1))
        t.expect("altup_unembd_proj", None, (d, d, n_in - 1))
        expect_tensors(t, d, n_layer, width)
        for i in range(n_layer):
            t.expect("altup_router", i, (d, n_in))
            t.expect("altup_predict_coef", i, (n_in, n_in * n_in))
            t.expect("altup_correct_coef", i, (n_in, n_in))
        return {"params": {"n_inputs": n_in, "active": active, "per_layer_width": width}}


def rms(v: np.ndarray) -> np.ndarray:
    """sqrt(mean(v^2)) over the last axis, kept as a trailing axis (float32)."""
    return np.sqrt(np.mean(np.square(v, dtype=F32), axis=-1, keepdims=True, dtype=F32))


def matched(y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """y rescaled to the magnitude `target` (HF: the mean square floored at 1e-5)."""
    mean_sq = np.mean(np.square(y, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return (y * target / np.sqrt(np.maximum(mean_sq, FLOOR))).astype(F32)


class _Layer:
    """One block's AltUp tensors."""

    def __init__(self, b: Any, i: int):
        self.router_norm = b.vector("altup_router_norm", i)
        self.router = b.table("altup_router", i)              # [S, d]
        self.predict = b.table("altup_predict_coef", i)       # [S*S, S]
        self.correct = b.table("altup_correct_coef", i)       # [S, S]
        self.correct_scale = b.vector("altup_correct_scale", i)


class Altup:
    """The stream op (module docstring): enter, layer, leave; bind at load."""

    def __init__(self, descriptor: Any, n_inputs: float = 4, active: float = 0, per_layer_width: float = 1):
        self.d, self.n_layer = descriptor.n_embd, descriptor.n_layer
        self.n, self.active = int(n_inputs), int(active)
        self.per_layer = PerLayerInputs(self.d, self.n_layer, int(per_layer_width))

    def bind(self, b: Any) -> None:
        self.norm = b.op("norm", b.d.norm, b.d.norm_eps)
        self.per_layer.bind(b)
        self.up = b.table("altup_proj").reshape(self.n - 1, self.d, self.d)          # [S-1, out, in]
        self.down = b.table("altup_unembd_proj").reshape(self.n - 1, self.d, self.d)
        self.layers = [_Layer(b, i) for i in range(self.n_layer)]

    def enter(self, x: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        target = rms(x)
        streams = [x] + [matched(x @ w.T, target) for w in self.up]
        return np.stack(streams).astype(F32), self.per_layer.inputs(x, ids)

    def _route(self, lw: _Layer, v: np.ndarray) -> np.ndarray:
        return np.tanh((self.norm(v, lw.router_norm) * F32(1.0 / self.d)) @ lw.router.T).astype(F32)

    def layer(self, i: int, state: tuple[np.ndarray, np.ndarray], block: Any) -> tuple[np.ndarray, np.ndarray]:
        xs, inputs = state
        lw, a, s = self.layers[i], self.active, self.n
        coefs = (self._route(lw, xs[a]) @ lw.predict.T).reshape(-1, s, s)           # [n, j, k]
        pred = (xs + np.einsum("njk,knd->jnd", coefs, xs)).astype(F32)
        out = block(np.ascontiguousarray(pred[a]))
        gains = self._route(lw, out) @ lw.correct.T + F32(1.0)                     # [n, S]
        fixed = (pred + gains.T[:, :, None] * (out - pred[a])[None]).astype(F32)
        fixed[1:] += self.per_layer.term(i, fixed[a] * lw.correct_scale, inputs)
        return fixed, inputs

    def leave(self, state: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        xs = state[0]
        target = rms(xs[0])
        merged = [xs[0]] + [matched(xs[k] @ w.T, target) for k, w in enumerate(self.down, start=1)]
        return np.mean(np.stack(merged), axis=0, dtype=F32).astype(F32)


def altup(descriptor: Any, n_inputs: float = 4, active: float = 0, per_layer_width: float = 1) -> Altup:
    """The factory (slot "stream"): the descriptor and the layout's parameters."""
    return Altup(descriptor, n_inputs, active, per_layer_width)
