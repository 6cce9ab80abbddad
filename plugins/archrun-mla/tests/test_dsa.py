"""archrun-mla's DeepSeek sparse attention op (attention="mla_dsa") against the lightning indexer and the
sparse attention written out naively in float64 (HF's DeepseekV32Indexer / DeepseekV32Attention order:
NEOX rope on the indexer's first dims, ReLU'd per-head scores weighted and summed, top-k, a softmax over the
chosen keys only), on both backends, as a prompt, token by token and in chunks across the top-k boundary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec, RopeSpec
from archrun_blocks import reference as blocks
from archrun_mla import dsa, indexer

H, ROPE, LORA, HI, DI, TOP_K, N = 3, 4, 10, 4, 8, 5, 14
THETA = 10000.0


def _spec() -> AttentionSpec:
    params = {"kv_lora_rank": LORA, "qk_rope": ROPE, "qk_nope": 6, "v_head_dim": LORA, "q_lora_rank": 8,
              "legacy_kv_b": 0, "index_heads": HI, "index_width": DI, "index_top_k": TOP_K}
    return AttentionSpec(kind="mla_dsa", n_head=H, n_head_kv=1, head_dim=ROPE + LORA, v_head_dim=LORA,
                         scale=1 / math.sqrt(6 + ROPE), params=params)


def _op(backend: str) -> dsa.DsaAttention:
    op = (dsa.dsa_fast if backend == "fast" else dsa.dsa_reference)(_spec())
    op.index_rope = blocks.rope_neox(RopeSpec(pairing="neox", n_rot=ROPE, freq_base=THETA))
    return op


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = {"q": rng.normal(0, 1, (N, H, ROPE + LORA)), "k": rng.normal(0, 1, (N, 1, ROPE + LORA)),
         "iq": rng.normal(0, 1, (N, HI * DI)), "ik": rng.normal(0, 1, (N, DI)),
         "iw": rng.normal(0, 0.5, (N, HI))}
    return {k: v.astype(np.float32) for k, v in x.items()}


def _neox64(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """HF's rotate_half rope on x[..., :ROPE] (pairs (i, i + ROPE/2)), float64; x [n, heads, width]."""
    theta = pos[:, None] * THETA ** (-np.arange(0, ROPE, 2) / ROPE)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., :ROPE // 2], x[..., ROPE // 2:ROPE]
    out = x.copy()
    out[..., :ROPE // 2], out[..., ROPE // 2:ROPE] = a * cos - b * sin, b * cos + a * sin
    return out


def naive(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(attention output [N, H, LORA], each query's index scores [N, N]) in float64."""
    x = {k: v.astype(np.float64) for k, v in x.items()}
    pos = np.arange(N, dtype=np.float64)
    iq = _neox64(x["iq"].reshape(N, HI, DI), pos)
    ik = _neox64(x["ik"].reshape(N, 1, DI), pos)[:, 0]
    per_head = np.maximum(np.einsum("qhd,td->qht", iq, ik) / math.sqrt(DI), 0)
    scores = np.einsum("qh,qht->qt", x["iw"], per_head) + np.triu(np.full((N, N), -np.inf), 1)
    out = np.empty((N, H, LORA))
    for i in range(N):
        keys = np.arange(i + 1) if i < TOP_K else np.argsort(-scores[i], kind="stable")[:TOP_K]
        s = np.einsum("hd,td->ht", x["q"][i], x["k"][keys, 0]) * _spec().scale
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[i] = p @ x["k"][keys, 0, ROPE:]
    return out, scores


def _run(x: dict[str, np.ndarray], backend: str, spans: list[slice]) -> np.ndarray:
    op = _op(backend)
    slot = op.new_slot(N)
    return np.concatenate([op(x["q"][s], x["k"][s], None, slot, s.start, x["iq"][s], x["ik"][s], x["iw"][s])
                           for s in spans])


SPANS = {"prompt": [slice(0, N)], "token_by_token": [slice(i, i + 1) for i in range(N)],
         "chunks_across_top_k": [slice(0, 3), slice(3, 9), slice(9, N)]}


@pytest.mark.parametrize("spans", SPANS, ids=list(SPANS))
@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_sparse_attention_equals_naive(backend, spans):
    x = _inputs(1)
    want, scores = naive(x)
    for i in range(TOP_K, N):  # the selection is well defined: no tie at the k-th place
        ranked = np.sort(scores[i, :i + 1])[::-1]
        assert ranked[TOP_K - 1] - ranked[TOP_K] > 1e-3 * np.abs(ranked).max()
    got = _run(x, backend, SPANS[spans])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_selection_matters():
    """The same inputs attending every key (no indexer) differ: the cases above test the selection."""
    x = _inputs(1)
    want, _ = naive(x)
    op = _op("reference")
    op.top_k = N
    dense = op(x["q"], x["k"], None, op.new_slot(N), 0, x["iq"], x["ik"], x["iw"])
    assert np.abs(dense[TOP_K:] - want[TOP_K:]).max() > 1e-2


@pytest.mark.parametrize("scorer", [indexer.index_scores, indexer.index_scores_chunked])
def test_scorers_agree(scorer, monkeypatch):
    """The reference's one einsum and the chunked BLAS scorer, chunks of one query, give the same scores."""
    monkeypatch.setattr(indexer, "SCORE_BUDGET", 1)
    rng = np.random.default_rng(3)
    q, w = rng.normal(0, 1, (6, HI, DI)).astype(np.float32), rng.normal(0, 1, (6, HI)).astype(np.float32)
    keys, pos = rng.normal(0, 1, (9, DI)).astype(np.float32), np.arange(3, 9)
    want = indexer.index_scores(q.copy(), w, keys, pos)
    np.testing.assert_allclose(scorer(q, w, keys, pos), want, rtol=1e-5, atol=1e-5)
    assert np.isneginf(want[0, 4:]).all() and np.isfinite(want[0, :4]).all()


def test_ties_at_the_kth_place_go_to_the_earlier_keys():
    scores = np.array([[0.0, 2.0, 0.0, -np.inf, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0, 3.0, 0.0]], np.float32)
    assert indexer.top_keys(scores, 3).tolist() == [[0, 1, 5], [0, 1, 4]]


def test_cache_holds_the_indexer_keys_beside_the_latent():
    assert _op("reference").new_slot(100).nbytes == 100 * (ROPE + LORA + DI) * 4
