"""gpt-oss decodes fused on the fast backend (one kernel call per layer: archrun-blocks' MoE layer kernel, with
the attention part's sink logits, the clamped SwiGLU as a gated activation part and the experts' biases in
their products), with the bits of the op-by-op path.

The three tiny fixtures themselves decode fused. Bits are compared on copies of them whose matrices are
Q8_0 (the fused and the op-by-op product kernels of a quantized type compute one token alike; float32 and
16-bit products of widths off 32 round differently, numpy's BLAS or the op path's kernel against the decode
kernel) and whose widths are made multiples of 32 for that (the embedding 48 -> 64, the experts 24 -> 32:
new random weights there): each layer's fused step gives the op-by-op block's output and cached K rows bit
for bit, on one thread and on two, and whole models token by token give the same logits."""

from __future__ import annotations

from pathlib import Path

import gguf
import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_decode_bits, check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.kernels.decode.fusion import FusedBlock
from archrun.kernels.matmul import qmatrix

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("gpt_oss_gqa_window6", "gpt_oss_mha_top3", "gpt_oss_mxfp4_widths")
Q8 = gguf.GGMLQuantizationType.Q8_0


def _widened_q8_0(src: Path, dst: Path, widths: tuple[int, int] | None = None) -> Path:
    """src with its embedding and expert widths rounded up to multiples of 32, or made `widths` (new random
    weights in the tensors whose shape changes), and every matrix Q8_0."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    d = int(r.fields[f"{arch}.embedding_length"].contents())
    f = int(r.fields[f"{arch}.expert_feed_forward_length"].contents())
    wide = {d: -(-d // 32) * 32, f: -(-f // 32) * 32} if widths is None else dict(zip((d, f), widths, strict=True))
    assert len(wide) == 2, "the embedding and expert widths must differ to be told apart"
    rng = np.random.default_rng(5)
    tensors = {}
    for t in r.tensors:
        a = np.asarray(t.data, np.float32)
        shape = tuple(wide.get(n, n) for n in a.shape)
        if shape != a.shape:
            norm = t.name.endswith("norm.weight")
            a = (rng.normal(1.0, 0.1, shape) if norm else rng.normal(0.0, 0.15, shape)).astype(np.float32)
        tensors[t.name] = (gguf.quants.quantize(a, Q8), Q8) if a.ndim >= 2 else a
    keys = {f"{arch}.embedding_length": wide[d], f"{arch}.expert_feed_forward_length": wide[f],
            f"{arch}.feed_forward_length": wide[f]}
    return rewrite_gguf(src, dst, drop_tensors=tuple(tensors), add_tensors=tensors, add_keys=keys)


@pytest.fixture(scope="module", params=FIXTURES)
def widened(request, tmp_path_factory) -> tuple:
    """(the fast model of a widened Q8_0 copy of the fixture, its path)."""
    path = _widened_q8_0(GOLDENS / f"{request.param}.gguf",
                         tmp_path_factory.mktemp("gpt_oss") / f"{request.param}.gguf")
    return archrun.load(path), path


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_decode_one_call_per_layer(name):
    model = archrun.load(GOLDENS / f"{name}.gguf")
    assert model.fused_blocks is not None
    assert len(model.fused_blocks) == model.descriptor.n_layer
    assert all(type(fb) is FusedBlock and not fb.dense for fb in model.fused_blocks)  # the MoE layer kernel
    assert archrun.load(GOLDENS / f"{name}.gguf", backend="reference").fused_blocks is None


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_layer_has_the_op_paths_bits(widened, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache (6 rows of context, then
    4 steps: past the sliding window of 6 of gpt_oss_gqa_window6 and gpt_oss_mxfp4_widths)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = widened
    assert model.fused_blocks is not None
    check_fused_steps(model, np.testing.assert_array_equal, lambda f, o: np.testing.assert_array_equal(f.k, o.k),
                      threads, context=6, steps=4)


def test_fused_decode_is_the_op_by_op_decode(widened):
    """Whole models token by token, fused against op by op (every layer and the head: the same bits)."""
    model, path = widened
    check_decode_bits(model, path, 12)


def test_biased_experts_on_the_decode_pool_have_one_threads_bits(tmp_path):
    """A copy with experts of 256 x 256 (Q8_0 gate|up groups of 139 KB, above the pool's minimum): on two
    threads the layers' products, the biased experts' included, go to the decode pool (each bias added by the
    thread that publishes the product); the logits are the bits of one thread and of the op-by-op path."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    path = _widened_q8_0(GOLDENS / "gpt_oss_mxfp4_widths.gguf", tmp_path / "wide.gguf", (256, 256))
    model = archrun.load(path)
    assert model.fused_blocks is not None and all(fb.pooled for fb in model.fused_blocks)
    ids = np.random.default_rng(8).integers(0, model.descriptor.n_vocab, 8)

    def decode(m, threads):
        qmatrix.set_threads(threads)
        cache = m.init_cache(16)
        return np.stack([m.forward_step([t], cache) for t in ids])

    before = qmatrix.current_threads()
    try:
        one = decode(model, 1)
        np.testing.assert_array_equal(one, decode(archrun.load(path, fused=False), 1))
        for _ in range(20):  # until the pool's worker has taken chunks (it is woken at each step's start)
            np.testing.assert_array_equal(decode(model, 2), one)
            if model._decode._pool.worker_chunks:
                break
        assert model._decode._pool.worker_chunks > 0
    finally:
        qmatrix.set_threads(before)
