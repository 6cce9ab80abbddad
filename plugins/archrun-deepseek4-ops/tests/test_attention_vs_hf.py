"""attention="deepseek4" (its layout and op, reference backend) against HF's DeepseekV4Attention on random
weights at float32: a sliding-only, a CSA (ratio 4, indexer top 3 of 2 heads) and an HCA (ratio 8) layer,
window 6, for a prompt longer than the window and several compression windows, and for decoding token by
token after a prompt (HF with its DynamicCache; archrun on its slot), and in chunks."""

from __future__ import annotations

import numpy as np
import pytest
from v4_layer import KINDS, WINDOW, archrun_layer, hf_layers, run, selection_margin, weights

from archrun_deepseek4_ops.attention import FastV4Attention, V4Attention

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

F32 = np.float32
N, PROMPT = 37, 23


@pytest.fixture(scope="module")
def layers():
    return hf_layers()


def _sliding_mask(q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    dist = q_pos[:, None] - k_pos[None, :]
    return np.where((dist >= 0) & (dist < WINDOW), 0.0, -np.inf).astype(F32)[None, None]


def _hf(cfg, attn, h: np.ndarray, cache=None, start: int = 0, n_cached: int = 0) -> np.ndarray:
    """HF's output for h [n, d] at positions start.. (with a cache holding n_cached sliding keys)."""
    rope = hf.DeepseekV4RotaryEmbedding(cfg)
    pos = np.arange(start, start + len(h))
    x, p = torch.from_numpy(h)[None], torch.from_numpy(pos)[None]
    emb = {"main": rope(x, p, layer_type="main"), "compress": rope(x, p, layer_type="compress")}
    mask = _sliding_mask(pos, np.arange(start - n_cached, start + len(h)))
    with torch.no_grad():
        return attn(x, emb, p, torch.from_numpy(mask), cache=cache)[0][0].numpy()


def _hf_decode(cfg, attn, h: np.ndarray) -> np.ndarray:
    """HF over h: the first PROMPT tokens as one prompt on a DynamicCache, then one token at a time."""
    from transformers import DynamicCache

    cache = DynamicCache(config=cfg)
    outs = [_hf(cfg, attn, h[:PROMPT], cache)]
    for t in range(PROMPT, len(h)):
        outs.append(_hf(cfg, attn, h[t:t + 1], cache, t, min(t, WINDOW - 1)))
    return np.concatenate(outs)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), np.abs(got - want).max() / np.abs(want).max()


BACKENDS = {"reference": V4Attention, "fast": FastV4Attention}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", range(3), ids=KINDS)
def test_prompt_matches_hf(layers, kind, backend):
    cfg, attn = layers
    h = np.random.default_rng(kind).standard_normal((N, cfg.hidden_size)).astype(F32)
    want = _hf(cfg, attn[kind], h)
    layer = archrun_layer(weights(attn[kind]), BACKENDS[backend])
    if kind == 1:
        assert selection_margin(layer, h) > 1e-3
    got, _ = run(layer, h, [slice(0, N)])
    _close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", range(3), ids=KINDS)
def test_decode_after_a_prompt_matches_hf(layers, kind, backend):
    cfg, attn = layers
    h = np.random.default_rng(10 + kind).standard_normal((N, cfg.hidden_size)).astype(F32)
    want = _hf_decode(cfg, attn[kind], h)
    np.testing.assert_allclose(want, _hf(cfg, attn[kind], h), rtol=0, atol=1e-5 * np.abs(want).max())
    spans = [slice(0, PROMPT)] + [slice(t, t + 1) for t in range(PROMPT, N)]
    layer = archrun_layer(weights(attn[kind]), BACKENDS[backend])
    if kind == 1:
        assert selection_margin(layer, h) > 1e-3
    got, _ = run(layer, h, spans)
    _close(got, want)


@pytest.mark.parametrize("kind", range(3), ids=KINDS)
def test_chunks_match_the_whole_prompt(layers, kind):
    """Chunks that split windows, and single tokens from position 0, against the whole prompt (archrun)."""
    cfg, attn = layers
    h = np.random.default_rng(20 + kind).standard_normal((N, cfg.hidden_size)).astype(F32)
    layer = archrun_layer(weights(attn[kind]))
    whole, _ = run(layer, h, [slice(0, N)])
    for spans in ([slice(0, 3), slice(3, 13), slice(13, 14), slice(14, N)], [slice(t, t + 1) for t in range(N)]):
        got, _ = run(layer, h, spans)
        _close(got, whole)


def test_the_compressed_entries_and_the_selection_matter(layers):
    """Each layer kind differs from the plain sliding attention on the same weights; CSA's indexer drops
    entries (with every entry visible it differs)."""
    cfg, attn = layers
    h = np.random.default_rng(5).standard_normal((N, cfg.hidden_size)).astype(F32)
    for kind in (1, 2):
        layer = archrun_layer(weights(attn[kind]))
        got, _ = run(layer, h, [slice(0, N)])
        qkv, op, o = layer
        op.ratio = op.index_heads = op.index_width = 0  # the same layer without its compressed entries
        plain, _ = run((qkv, op, o), h, [slice(0, N)])
        assert np.abs(got - plain)[WINDOW:].max() > 1e-2 * np.abs(got).max()
    layer = archrun_layer(weights(attn[1]))
    got, _ = run(layer, h, [slice(0, N)])
    layer[1].top_k = N
    dense, _ = run(layer, h, [slice(0, N)])
    assert np.abs(got - dense).max() > 1e-2 * np.abs(got).max()
