"""kernels.decode.layer.decode_rows on small models: a batch of rows gives each row the bits of its one-token step.

Model-free (synthetic models for every weight type, and a tiny Gemma 3 with sliding-window rings), so it
also runs with bounds checking on (Makefile). The reference is the one-token fused step (decode_layer),
checked against the op-by-op path in tests/kernels/test_fusion.py; here the claim is exact equality of the two
fused paths: the same parts, per-row 8-bit activation blocks and the same per-block accumulation order.
tests/run/test_batch_rows.py checks the same on the real models and through speculative decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from support.fused import QUANT, _model
from support.tiny import TINY, fixtures

import archrun
from archrun.kernels.matmul import qmatrix


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = qmatrix.current_threads()
    if request.param > qmatrix.numba.config.NUMBA_NUM_THREADS:
        pytest.skip("one thread available")
    qmatrix.set_threads(request.param)
    yield request.param
    qmatrix.set_threads(before)


def _check_rows_equal_steps(m, prefixes, spans, capacity=64, **kw):
    solo = [m.init_cache(capacity, **kw) for _ in prefixes]
    together = [m.init_cache(capacity, **kw) for _ in prefixes]
    for p, a, b in zip(prefixes, solo, together, strict=True):
        m.forward_step(p, a)
        m.forward_step(p, b)
    want = [np.stack([m.forward_step([t], c) for t in s]) for s, c in zip(spans, solo, strict=True)]
    got = m.forward_step_batch_spans(spans, together, all_logits=True)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
    assert [len(c) for c in together] == [len(c) for c in solo]


@pytest.mark.parametrize("t", [*QUANT, T.F16, T.F32], ids=lambda t: T(t).name)
def test_rows_equal_one_token_steps_for_every_weight_type(synth_model, t, threads):
    m = _model(synth_model, t)
    assert m._decode.rows_ready
    # three sequences at different positions: single tokens and spans in one pass
    _check_rows_equal_steps(m, [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10]], [[11], [12, 13, 14, 15], [16, 17]])


def test_rows_with_biases_and_without_qk_norm(synth_model):
    m = _model(synth_model, T.Q4_K, arch="qwen2", qk_norm=False, qkv_bias=True)
    _check_rows_equal_steps(m, [[1, 2], [3, 4, 5]], [[6, 7, 8], [9]])


@pytest.mark.parametrize("name", fixtures("gemma3")[:1])
def test_rows_across_sliding_window_rings(name, threads):
    m = archrun.load(TINY[name])
    window = max(ls.attention.window for ls in m.descriptor.layers)
    assert 0 < window < 40
    ids = [(7 * i) % 200 + 3 for i in range(window + 30)]
    # rings of window + 2 rows: spans wrap around the ring and overwrite rows in order
    _check_rows_equal_steps(m, [ids[:window - 2], ids[:3]], [ids[window - 2:window + 9], ids[3:5]],
                            capacity=window + 40, max_rewind=2)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_rows_on_other_cache_types(synth_model, kv_type, threads):
    """Caches of f16 / q8_0 rows run the multi-row kernel too (their attention parts, on the step's thread),
    each row with the bits of its one-token step on the same kind of cache."""
    m = _model(synth_model, T.Q4_K)
    assert m._rows_blocks(m.init_cache(8, kv_type=kv_type)) is m._decode.blocks_for(kv_type) is not None
    _check_rows_equal_steps(m, [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10]], [[11], [12, 13, 14, 15], [16, 17]],
                            kv_type=kv_type)


def test_rows_of_a_batch_on_mixed_cache_types(synth_model):
    """One batch over caches of three kv types: a pass per type, every row its one-token step's bits."""
    m = _model(synth_model, T.Q8_0)
    kinds = ["f32", "f16", "q8_0", "f16"]
    solo = [m.init_cache(32, kv_type=k) for k in kinds]
    together = [m.init_cache(32, kv_type=k) for k in kinds]
    spans = [[3, 4], [5], [6, 7, 8], [9]]
    for i, (a, b) in enumerate(zip(solo, together, strict=True)):
        m.forward_step([1, 2 + i], a)
        m.forward_step([1, 2 + i], b)
    want = [np.stack([m.forward_step([t], c) for t in s]) for s, c in zip(spans, solo, strict=True)]
    got = m.forward_step_batch_spans(spans, together, all_logits=True)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
