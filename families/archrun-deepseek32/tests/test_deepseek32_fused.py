"""deepseek32 decodes fused on the fast backend: every layer of both fixtures is one kernel call
(archrun-mla's sparse-attention layer kernel, dense FFN or mixture of experts), and a token-by-token decode
through it, across the indexer's top-k, reproduces HF's logits at every position. (That the fused step has
the op-by-op path's bits is archrun-mla's test_fused_dsa.py, on Q8_0 copies of these fixtures: the float32
products of these files round differently in the decode kernel and in numpy's BLAS.)"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

import archrun
from archrun.kernels.decode.fusion import FusedBlock
from archrun.kernels.matmul import qmatrix

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("deepseek32_top16", "deepseek32_top24_16heads")
TOLERANCE = 1e-4  # of the logit range, as the battery


@pytest.mark.parametrize("name", FIXTURES)
def test_every_layer_decodes_in_one_call(name):
    from archrun_mla.kernels import dsa_layer

    model = archrun.load(GOLDENS / f"{name}.gguf")
    assert model.fused_blocks is not None
    assert all(type(fb) is FusedBlock for fb in model.fused_blocks)
    dense = model.gguf.metadata["deepseek32.leading_dense_block_count"]
    kernels = [fb._kernel for fb in model.fused_blocks]
    assert kernels == ([dsa_layer.decode_dsa_layer] * dense
                       + [dsa_layer.decode_dsa_moe_layer] * (len(kernels) - dense))
    assert archrun.load(GOLDENS / f"{name}.gguf", backend="reference").fused_blocks is None


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", FIXTURES)
def test_fused_decode_reproduces_hf(name, threads):
    """Token by token through the fused layers (the indexer selecting from position top_k on) against HF's
    logits of the whole prompt, on one thread and on two."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    golden = np.load(GOLDENS / f"{name}.npz")
    ids, want = golden["ids"], golden["logits"]
    model = archrun.load(GOLDENS / f"{name}.gguf")
    assert model.fused_blocks is not None and model.plan.layers[0].attention.top_k < len(ids)
    before = qmatrix.current_threads()
    qmatrix.set_threads(threads)
    try:
        cache = model.init_cache(len(ids))
        got = np.stack([np.asarray(model.forward_step([t], cache)).reshape(-1) for t in ids])
    finally:
        qmatrix.set_threads(before)
    scale = np.abs(want).max()
    for pos in range(len(ids)):
        assert np.abs(got[pos] - want[pos]).max() <= TOLERANCE * scale, f"position {pos}"
