"""Command R+'s per-head Q/K LayerNorms (a weight row per head: `attn_q_norm` {hd, H}, `attn_k_norm` {hd, KV})
decode fused on the fast backend (one kernel call per layer: the dense layer kernel normalises head h of q and
k with its own row), with the bits of the op-by-op path.

The fixture command_r_qknorm_64layer itself decodes fused. Bits are compared on a copy of it whose matrices
are Q8_0 (the fused and the op-by-op product kernels of a quantized type compute one token alike; float32
products of widths off 32 round differently) and whose widths are multiples of 32 for that (the embedding and
FFN 16 -> 64, the heads 8 -> 32: new random weights there, the per-head norm rows each their own): each
layer's fused step gives the op-by-op block's output and cached K rows bit for bit, on one thread and on two,
and the whole model token by token gives the same logits."""

from __future__ import annotations

from pathlib import Path

import gguf
import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_decode_bits, check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf

GOLDENS = Path(__file__).parent / "goldens"
FIXTURE = GOLDENS / "command_r_qknorm_64layer.gguf"
Q8 = gguf.GGMLQuantizationType.Q8_0
WIDE = {16: 64, 8: 32}  # the embedding and FFN width, the head width


@pytest.fixture(scope="module")
def widened(tmp_path_factory) -> tuple:
    """(the fast model of a Q8_0 copy of the fixture with its widths made WIDE, its path)."""
    r = gguf.GGUFReader(str(FIXTURE))
    rng = np.random.default_rng(7)
    tensors = {}
    for t in r.tensors:
        a = np.asarray(t.data, np.float32)
        shape = tuple(WIDE.get(n, n) for n in a.shape)
        norm = t.name.endswith("norm.weight")
        if shape != a.shape:
            a = (rng.normal(1.0, 0.2, shape) if norm else rng.normal(0.0, 0.15, shape)).astype(np.float32)
        tensors[t.name] = a if norm else (gguf.quants.quantize(a, Q8), Q8)
    keys = {"command-r.embedding_length": 64, "command-r.feed_forward_length": 64}
    path = rewrite_gguf(FIXTURE, tmp_path_factory.mktemp("command_r") / "qknorm_wide.gguf",
                        drop_tensors=tuple(tensors), add_tensors=tensors, add_keys=keys)
    return archrun.load(path), path


def test_the_fixture_decodes_one_call_per_layer():
    model = archrun.load(FIXTURE)
    assert all(lp.spec.attention.qk_norm_per_head for lp in model.plan.layers)
    assert model.fused_blocks is not None and len(model.fused_blocks) == model.descriptor.n_layer
    assert all(fb.dense for fb in model.fused_blocks)  # the dense layer kernel
    assert archrun.load(FIXTURE, backend="reference").fused_blocks is None


def test_the_widened_copy_has_a_norm_row_per_head(widened):
    """Its q norms differ from head to head (a kernel normalising every head with one row would fail below)."""
    model, _ = widened
    a = model.plan.layers[0].spec.attention
    assert (a.n_head, a.n_head_kv, a.head_dim) == (2, 1, 32) and a.qk_norm_per_head
    q_norm = model.plan.layers[0].q_norm
    assert q_norm.shape == (2, 32) and not np.array_equal(q_norm[0], q_norm[1])
    assert model.fused_blocks is not None and all(fb.dense for fb in model.fused_blocks)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_layer_has_the_op_paths_bits(widened, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache (5 rows of context,
    then 4 steps)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = widened
    check_fused_steps(model, np.testing.assert_array_equal, lambda f, o: np.testing.assert_array_equal(f.k, o.k),
                      threads)


def test_fused_decode_is_the_op_by_op_decode(widened):
    """The whole model token by token, fused against op by op (every layer and the head: the same bits)."""
    model, path = widened
    check_decode_bits(model, path, 10)
