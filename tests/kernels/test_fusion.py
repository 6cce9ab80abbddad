"""Fused decode blocks (archrun.kernels.decode.fusion): one kernel call per layer computes what the op-by-op
block computes.

The op-by-op path (Interpreter.run_block) is itself checked against HF transformers and
llama.cpp; here every weight type, stacked and unstacked products, biases and q/k norms are
run through both on the same inputs. HF agreement of fused decoding is checked by the
token-by-token tests of test_tiny_hf.py and test_sliding_cache.py, which run it.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from support.fused import QUANT, _compare_blocks, _model, _raw, decode_paths_agree
from support.tiny import LEVEL0, TINY, fixtures

import archrun


@pytest.mark.parametrize("t", [*QUANT, T.F16, T.F32], ids=lambda t: T(t).name)
def test_fused_block_matches_op_path_for_every_weight_type(synth_model, t):
    m = _model(synth_model, t)
    assert _compare_blocks(m) <= 1e-5


@pytest.mark.parametrize("t", [T.Q4_K, T.F32], ids=lambda t: T(t).name)
def test_fused_block_with_biases_and_without_qk_norm(synth_model, t):
    m = _model(synth_model, t, arch="qwen2", qk_norm=False, qkv_bias=True)
    assert m.plan.layers[0].spec.attention.qkv_bias
    assert _compare_blocks(m) <= 1e-5


@pytest.mark.parametrize("name", fixtures(*LEVEL0, "gemma3"))
def test_dense_fixtures_decode_one_call_per_layer(name):
    """Every dense fixture decodes fused on the fast backend; the reference backend keeps the op path."""
    fast = archrun.load(TINY[name])
    if not any(lp.spec.is_moe for lp in fast.plan.layers):
        assert fast.fused_blocks is not None and len(fast.fused_blocks) == fast.descriptor.n_layer
    assert archrun.load(TINY[name], backend="reference").fused_blocks is None




def test_fused_and_op_path_decode_agree_through_a_sequence(synth_model):
    decode_paths_agree(_model(synth_model, T.Q8_0, n_layer=2), 20)


def test_split_products_equal_one_thread_products():
    """A product group big enough to be split over threads gives the same rows as one thread."""
    from archrun.kernels.decode import block
    from archrun.kernels.matmul import qmatrix

    rng = np.random.default_rng(5)
    n_out, n_in = 4096, 1024  # 2 MiB of Q4_0 fields: at the split threshold
    w = qmatrix.prepare(_raw(rng, T.Q4_0, n_out, n_in), int(T.Q4_0), n_in)
    small = qmatrix.prepare(_raw(rng, T.Q8_0, 64, n_in), int(T.Q8_0), n_in)
    ms = (block.uniform(w), block.uniform(small), block.absent_matrix())
    x = rng.standard_normal((2, n_in)).astype(np.float32)
    one, split = (np.zeros((2, n_out + 64), np.float32) for _ in range(2))
    block.product_rows(ms, x, one, 1)
    block.product_rows(ms, x, split, 3)
    np.testing.assert_array_equal(split, one)
    np.testing.assert_allclose(one[:, :n_out], qmatrix.matmul(w, x), rtol=0, atol=1e-5 * np.abs(one).max())
