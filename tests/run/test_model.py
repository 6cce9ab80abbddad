"""The interpreter's entries and contracts on synthetic models."""

import numpy as np
import pytest
from support.tiny import TINY, fixtures

import archrun
from archrun.decoder import Decoder
from archrun.errors import ContextOverflow, InvalidRequest, WrongBlockStyle

RNG = np.random.default_rng(7)


def _rel(a, b):
    return float(np.abs(a - b).max() / (b.max() - b.min()))


@pytest.fixture(params=["reference", "fast"])
def backend(request):
    return request.param


@pytest.fixture
def qwen3(synth_model):
    return synth_model(arch="qwen3", n_layer=2)


def test_model_is_a_decoder(qwen3):
    m = archrun.load(qwen3)
    assert isinstance(m, Decoder)
    assert m.caps.batch and not m.caps.host_step


def test_cached_prefill_stepwise_and_no_cache_agree(qwen3, backend):
    m = archrun.load(qwen3, backend=backend)
    ids = RNG.integers(0, m.descriptor.n_vocab, 40)
    full = m.logits(ids)
    assert full.shape == (40, m.descriptor.n_vocab) and full.dtype == np.float32
    cache = m.init_cache(64)
    prefill = m.forward_step(ids[:25], cache, all_logits=True)
    rest = np.stack([m.forward_step([t], cache) for t in ids[25:]])
    assert len(cache) == 40
    assert _rel(np.concatenate([prefill, rest]), full) <= 1e-4
    assert _rel(m.forward_step(ids[:5], m.init_cache(8)), full[4]) <= 1e-4


def test_rewind_is_exact(qwen3):
    m = archrun.load(qwen3)
    ids = RNG.integers(0, m.descriptor.n_vocab, 12)
    cache = m.init_cache(32)
    m.forward_step(ids, cache)
    cache.rewind(4)
    assert len(cache) == 8
    again = m.forward_step(ids[8:], cache, all_logits=True)
    np.testing.assert_allclose(again, m.logits(ids)[8:], rtol=0, atol=1e-4)
    with pytest.raises(InvalidRequest):
        cache.rewind(13)


def test_block_styles_agree_and_guard_each_other(qwen3):
    fused = archrun.load(qwen3)
    host = archrun.load(qwen3, block_style="host_reference")
    ids = RNG.integers(0, fused.descriptor.n_vocab, 16)
    step = host.host_step(ids, host.init_cache(16))
    assert step.hidden.shape == (16, host.descriptor.n_embd)
    assert _rel(step.logits, fused.logits(ids)) <= 1e-5
    with pytest.raises(WrongBlockStyle):
        fused.host_step(ids, fused.init_cache(16))
    with pytest.raises(WrongBlockStyle):
        host.forward_step_batch([ids], [host.init_cache(16)])
    with pytest.raises(WrongBlockStyle):
        host.forward_step_batch_spans([ids], [host.init_cache(16)])


def test_forward_step_batch_matches_single_steps(qwen3):
    m = archrun.load(qwen3)
    a, b = RNG.integers(0, m.descriptor.n_vocab, 5), RNG.integers(0, m.descriptor.n_vocab, 9)
    out = m.forward_step_batch([a, b], [m.init_cache(16), m.init_cache(16)])
    np.testing.assert_allclose(out[0], m.logits(a)[-1], atol=1e-5)
    np.testing.assert_allclose(out[1], m.logits(b)[-1], atol=1e-5)


def test_moe_model_runs_and_agrees(synth_model, backend):
    m = archrun.load(synth_model(arch="qwen3moe", n_expert=4, n_expert_used=2), backend=backend)
    ids = RNG.integers(0, m.descriptor.n_vocab, 20)
    cache = m.init_cache(20)
    steps = np.stack([m.forward_step([t], cache) for t in ids])
    assert _rel(steps, m.logits(ids)) <= 1e-4


@pytest.mark.parametrize("ids", [[], [[1, 2]], [1.5, 2.0], [-1], [10**6], ["a"]])
def test_bad_token_ids(qwen3, ids):
    m = archrun.load(qwen3)
    with pytest.raises(InvalidRequest):
        m.forward_step(ids, m.init_cache(8))


def test_context_overflow(qwen3):
    m = archrun.load(qwen3)
    cache = m.init_cache(4)
    m.forward_step([1, 2, 3], cache)
    with pytest.raises(ContextOverflow):
        m.forward_step([4, 5], cache)
    assert len(cache) == 3  # nothing was written
    with pytest.raises(ContextOverflow):
        m.init_cache(10**6)
    with pytest.raises(InvalidRequest):
        m.init_cache(0)


def test_bad_backend_and_style(qwen3):
    with pytest.raises(InvalidRequest):
        archrun.load(qwen3, backend="gpu")
    with pytest.raises(archrun.ArchrunError):
        archrun.load(qwen3, block_style="diagonal")


def test_unsupported_quant_type_is_named_at_load(synth_model):
    import gguf

    from archrun.errors import UnsupportedQuantType

    # IQ4_NL blocks: 2-byte scale + 16 bytes of nibbles per 32 weights; contents do not matter
    raw = np.zeros((64, 32 // 32 * 18), np.uint8)  # attn_q of a 32-wide model: 64 rows x 1 block
    path = synth_model(tensor_overrides={"blk.0.attn_q.weight": raw}, quant_types={"blk.0.attn_q.weight":
                                                                                    gguf.GGMLQuantizationType.IQ4_NL})
    with pytest.raises(UnsupportedQuantType, match="blk.0.attn_q.weight.*IQ4_NL"):
        archrun.load(path)


def _chunked(m, ids, chunk, **kw):
    """forward_step's logits of every position, the prompt in passes of `chunk` tokens."""
    m.prefill_chunk = chunk
    try:
        return m.forward_step(ids, m.init_cache(len(ids) + 4, **kw), all_logits=True)
    finally:
        del m.prefill_chunk  # back to the class default


@pytest.mark.parametrize("chunk", [7, 16])
def test_a_long_prompt_in_chunks_computes_the_one_pass_logits(qwen3, backend, chunk):
    """The prompt goes in passes of prefill_chunk tokens, each attending to the rows the earlier ones cached:
    the logits of every position are the single pass's to float32 rounding (a float64-free comparison of
    two summation orders of the same math)."""
    m = archrun.load(qwen3, backend=backend)
    ids = RNG.integers(0, m.descriptor.n_vocab, 40)
    whole = _chunked(m, ids, 10**6)
    assert _rel(_chunked(m, ids, chunk), whole) <= 1e-5


@pytest.mark.parametrize("name", fixtures("gemma3")[:1])
def test_chunks_of_a_prompt_cross_sliding_window_rings(name):
    """Passes of a few tokens over rings of window + 2 rows: each pass sees the window the one-pass prompt
    sees (earlier passes' rows from the ring, its own from the pass), for f32 and f16 rows. With f16 rows a pass
    reads the earlier passes' K/V rounded to f16 where the one pass used its float32 rows: differences up to
    the f16 rounding of K/V (2^-11 relative; measured 2.6e-5 of the logits' range), not float32 rounding."""
    m = archrun.load(TINY[name])
    window = max(ls.attention.window for ls in m.descriptor.layers)
    ids = [(7 * i) % 200 + 3 for i in range(2 * window + 11)]
    for kv, tol in (("f32", 1e-5), ("f16", 2.0**-11)):
        whole = _chunked(m, ids, 10**6, max_rewind=2, kv_type=kv)
        for chunk in (5, window - 1, window + 3):
            assert _rel(_chunked(m, ids, chunk, max_rewind=2, kv_type=kv), whole) <= tol, (kv, chunk)
