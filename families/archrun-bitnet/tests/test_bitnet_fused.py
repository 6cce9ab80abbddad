"""BitNet's sub-layer norms (`attn_sub_norm` on the attention's output before its projection, `ffn_sub_norm` on
the FFN's hidden before the down projection) decode fused on the fast backend: the dense layer kernel runs them
through the block's norm part, archrun-blocks' "rms_act8" (RMSNorm, then int8 per row), with the bits of the
op-by-op path.

Both fixtures themselves decode fused. Bits are compared on Q8_0 copies of them (the fused and the op-by-op
product kernels of a quantized type compute one token alike; float32 products of widths off 32 round
differently) whose FFN width is a multiple of 32 (bitnet_2b4t's 176 -> 192: new random weights there): each
layer's fused step gives the op-by-op block's output and cached K rows bit for bit, on one thread and on two,
and whole models token by token give the same logits, one sequence and a batch of two."""

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
FIXTURES = ("bitnet_2b4t", "bitnet_3layer_kv2")
Q8 = gguf.GGMLQuantizationType.Q8_0


@pytest.fixture(scope="module", params=FIXTURES)
def widened(request, tmp_path_factory) -> tuple:
    """(the fast model of a Q8_0 copy of the fixture with its FFN width rounded up to a multiple of 32, its
    path)."""
    src = GOLDENS / f"{request.param}.gguf"
    r = gguf.GGUFReader(str(src))
    f = int(r.fields["bitnet.feed_forward_length"].contents())
    wide = {f: -(-f // 32) * 32}
    rng = np.random.default_rng(9)
    tensors = {}
    for t in r.tensors:
        a = np.asarray(t.data, np.float32)
        shape = tuple(wide.get(n, n) for n in a.shape)
        norm = t.name.endswith("norm.weight")
        if shape != a.shape:
            a = (rng.normal(1.0, 0.1, shape) if norm else rng.normal(0.0, 0.15, shape)).astype(np.float32)
        tensors[t.name] = a if norm else (gguf.quants.quantize(a, Q8), Q8)
    path = rewrite_gguf(src, tmp_path_factory.mktemp("bitnet") / f"{request.param}.gguf",
                        drop_tensors=tuple(tensors), add_tensors=tensors,
                        add_keys={"bitnet.feed_forward_length": wide[f]})
    return archrun.load(path), path


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_decode_one_call_per_layer(name):
    model = archrun.load(GOLDENS / f"{name}.gguf")
    assert all(lp.attn_sub_norm is not None and lp.ffn.sub_norm is not None for lp in model.plan.layers)
    assert model.fused_blocks is not None and len(model.fused_blocks) == model.descriptor.n_layer
    assert all(fb.dense for fb in model.fused_blocks)  # the dense layer kernel
    assert archrun.load(GOLDENS / f"{name}.gguf", backend="reference").fused_blocks is None


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_layer_has_the_op_paths_bits(widened, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache (5 rows of context, then
    4 steps)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = widened
    check_fused_steps(model, np.testing.assert_array_equal, lambda f, o: np.testing.assert_array_equal(f.k, o.k),
                      threads)


def test_the_sub_norms_change_the_step(widened):
    """Without its sub-layer norms a layer's step gives other bits (so the check above sees them)."""
    model, _ = widened
    lp, fb = model.plan.layers[0], model.fused_blocks[0]
    cache = model.init_cache(4)
    x = np.random.default_rng(2).standard_normal(model.descriptor.n_embd).astype(np.float32)
    angles = model.rope_angles(np.array([0]))
    with_sub = x.copy()
    fb(with_sub, cache.slots[0], 0, angles)
    attn_sub, ffn_sub = lp.attn_sub_norm, lp.ffn.sub_norm
    lp.attn_sub_norm = lp.ffn.sub_norm = None
    try:
        plain = model.run_block(lp, x[None].copy(), model.init_cache(4).slots[0], 0, angles)[0]
    finally:
        lp.attn_sub_norm, lp.ffn.sub_norm = attn_sub, ffn_sub
    assert not np.array_equal(with_sub, plain)


def test_fused_decode_is_the_op_by_op_decode(widened):
    """Whole models token by token, fused against op by op (every layer and the head: the same bits), and a
    batch of two sequences through the multi-row kernel against their single steps."""
    model, path = widened
    ids = check_decode_bits(model, path, 10)
    # the multi-row kernel (kernels.decode.layer.decode_rows): a batch of two sequences, each row the bits of
    # its own one-token step
    singles, batched = [model.init_cache(16) for _ in ids[:2]], [model.init_cache(16) for _ in ids[:2]]
    for step in range(4):
        tokens = [int(ids[step]), int(ids[-1 - step])]
        want = [model.forward_step([t], c) for t, c in zip(tokens, singles, strict=True)]
        got = model.forward_step_batch([[t] for t in tokens], batched)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
