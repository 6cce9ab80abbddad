"""archrun-mla's ops against MLA written out naively in float64 (every head's keys and values
expanded from the latent, as HF's DeepseekV3Attention computes them): absorbed scoring over the
latent cache, on both backends, prompt and token by token."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun_blocks import reference as blocks
from archrun_mla import attention
from archrun_mla.layout import _MlaOutput, _MlaQkv

H, D, LORA, ROPE, NOPE, VD, N = 3, 24, 10, 4, 6, 5, 7
EPS = 1e-6


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"q": rng.normal(0, 0.4, (H * (NOPE + ROPE), D)), "kv_a": rng.normal(0, 0.4, (LORA + ROPE, D)),
         "kv_norm": rng.normal(1, 0.2, LORA), "k_b": rng.normal(0, 0.4, (H, LORA, NOPE)),
         "v_b": rng.normal(0, 0.4, (H, VD, LORA)), "o": rng.normal(0, 0.4, (D, H * VD))}
    return {k: v.astype(np.float32) for k, v in w.items()}


def _rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def _rope_pairs(x, pos):
    """NORM pairing on x[..., :ROPE]: (x[2i], x[2i+1]) rotated by pos * 10000^(-2i/ROPE)."""
    theta = pos[:, None] * 10000.0 ** (-np.arange(0, ROPE, 2) / ROPE)      # [n, R/2]
    cos, sin = np.cos(theta), np.sin(theta)
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (ROPE // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    a, b = x[..., 0:ROPE:2], x[..., 1:ROPE:2]
    out = x.copy()
    out[..., 0:ROPE:2], out[..., 1:ROPE:2] = a * cos - b * sin, a * sin + b * cos
    return out


def naive(w: dict[str, np.ndarray], h: np.ndarray) -> np.ndarray:
    """HF's order of operations in float64: expand k/v per head from the latent, then attend."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n, pos = len(h), np.arange(len(h), dtype=np.float64)
    q = (h @ w["q"].T).reshape(n, H, NOPE + ROPE)
    q_nope, q_pe = q[..., :NOPE], _rope_pairs(q[..., NOPE:], pos)
    ckv = h @ w["kv_a"].T
    latent, k_pe = _rms(ckv[:, :LORA], w["kv_norm"]), _rope_pairs(ckv[:, LORA:], pos)
    k_nope = np.einsum("hcp,nc->nhp", w["k_b"], latent)                      # [n, H, nope]
    v = np.einsum("hvc,nc->nhv", w["v_b"], latent)                           # [n, H, v]
    scores = (np.einsum("qhp,khp->hqk", q_nope, k_nope) + np.einsum("qhr,kr->hqk", q_pe, k_pe))
    scores = scores / math.sqrt(NOPE + ROPE) + np.triu(np.full((n, n), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("hqk,khv->qhv", p, v).reshape(n, H * VD)
    return out @ w["o"].T


def _absorbed(w, backend):
    def matrix(a):
        return lambda x: x @ a.T

    def norm(x, weight):
        return blocks.rms_norm(EPS)(x, weight)

    p = {"kv_lora_rank": LORA, "qk_rope": ROPE, "qk_nope": NOPE, "v_head_dim": VD}
    qkv = _MlaQkv(matrix(w["q"]), matrix(w["kv_a"]), w["kv_norm"], norm, w["k_b"], p)
    spec = AttentionSpec(kind="mla", n_head=H, n_head_kv=1, head_dim=ROPE + LORA, v_head_dim=LORA,
                         scale=1 / math.sqrt(NOPE + ROPE), params={**p, "q_lora_rank": 0, "legacy_kv_b": 0})
    op = (attention.mla_fast if backend == "fast" else attention.mla_reference)(spec)
    return qkv, op, _MlaOutput(w["v_b"], matrix(w["o"]))


def _run(w, h, backend, step: bool) -> np.ndarray:
    """The interpreter's order: qkv, rope on the first ROPE dims, the latent-cache attention, output."""
    qkv, op, out = _absorbed(w, backend)
    slot = op.new_slot(N)
    spans = [slice(i, i + 1) for i in range(N)] if step else [slice(0, N)]
    rows = []
    for s in spans:
        q, k, v = qkv(h[s])
        n = len(q)
        pos = np.arange(s.start, s.start + n, dtype=np.float64)
        q = _rope_pairs(q.reshape(n, H, -1).astype(np.float64), pos).astype(np.float32)
        k = _rope_pairs(k.reshape(n, 1, -1).astype(np.float64), pos).astype(np.float32)
        a = op(q, k, v.reshape(n, 1, LORA), slot, s.start)
        rows.append(out(a.reshape(n, -1)))
    return np.concatenate(rows)


@pytest.mark.parametrize("step", [False, True], ids=["prompt", "token_by_token"])
@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_absorbed_latent_attention_equals_naive_mla(backend, step):
    w = _weights(1)
    h = np.random.default_rng(2).normal(0, 1, (N, D)).astype(np.float32)
    got, want = _run(w, h, backend, step), naive(w, h)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_cache_is_one_latent_row_per_position():
    _, op, _ = _absorbed(_weights(1), "reference")
    assert op.new_slot(100).nbytes == 100 * (LORA + ROPE) * 4


def test_sliding_window_is_refused():
    spec = AttentionSpec(kind="mla", n_head=H, n_head_kv=1, head_dim=ROPE + LORA, v_head_dim=LORA, scale=0.3,
                         window=8, params={"qk_rope": ROPE})
    with pytest.raises(Exception, match="no sliding window"):
        attention.mla_reference(spec)
