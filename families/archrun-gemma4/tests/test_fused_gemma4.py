"""Gemma 4's one-stream files decode fused (attention "gemma4"'s layer kernel: one kernel call per layer)
with the bits of the op-by-op path. On copies of the tiny HF fixtures whose FFN width is made a multiple of 32
(new random FFN weights where it changes) and whose block matrices are Q8_0 (the fused and the op-by-op
product kernels of a quantized type compute one token alike; float32 products differ in rounding, numpy's BLAS
against the decode kernel), each layer's fused step gives the op-by-op block's output and cached rows bit for
bit, on one thread and on two, and whole models decode the same logits token by token, across a rewind. Past 128
visible rows, and on a sliding layer's ring once it wraps around, archrun-blocks' attention part sums in another
order than its op-by-op attention (as in every model's fused layers): there the results stay within float32
rounding. Files with per-layer inputs or mixture blocks decode op by op."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.kernels.decode.fusion import FusedBlock
from archrun.kernels.matmul import qmatrix
from archrun_blocks.reference import RingKvSlot
from archrun_gemma4_ops.attention import SharedSlot

GOLDENS = Path(__file__).resolve().parent / "goldens"
FUSED = ("gemma4_dense", "gemma4_k_eq_v", "gemma4_kv_shared")
QUANTIZED = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FF = 32  # FFN widths are rounded up to a multiple of this (Q8_0 blocks along ffn_down's input)


def _role(name: str) -> str:
    return name.split(".")[2] if name.startswith("blk.") else ""


def _q8_0_copy(src: Path, dst: Path) -> Path:
    """src with FFN widths rounded up to multiples of 32 (new random FFN weights where one changes) and Q8_0
    block matrices, output and token embeddings."""
    import gguf

    r = gguf.GGUFReader(str(src))
    rng = np.random.default_rng(5)
    arch = r.fields["general.architecture"].contents()
    q8 = gguf.GGMLQuantizationType.Q8_0
    tensors = {}
    for t in r.tensors:
        role, a = _role(t.name), np.asarray(t.data, np.float32)
        if role in ("ffn_gate", "ffn_up", "ffn_down"):
            ff = a.shape[1] if role == "ffn_down" else a.shape[0]
            wide = -(-ff // FF) * FF
            if wide != ff:
                shape = (a.shape[0], wide) if role == "ffn_down" else (wide, a.shape[1])
                a = rng.normal(0, 0.15, shape).astype(np.float32)
        if role in QUANTIZED or t.name in ("output.weight", "token_embd.weight"):
            tensors[t.name] = (gguf.quants.quantize(a, q8), q8)
    ff = r.fields[f"{arch}.feed_forward_length"].contents()
    wide = [-(-f // FF) * FF for f in ff] if isinstance(ff, list) else -(-ff // FF) * FF
    return rewrite_gguf(src, dst, drop_tensors=tuple(tensors), add_tensors=tensors,
                        add_keys={f"{arch}.feed_forward_length": wide})


@pytest.fixture(scope="module", params=FUSED)
def q8(request, tmp_path_factory):
    """(the fast model of the fixture's Q8_0 copy, its path)."""
    path = _q8_0_copy(GOLDENS / f"{request.param}.gguf", tmp_path_factory.mktemp("g4") / f"{request.param}.gguf")
    return archrun.load(path), path


@pytest.mark.parametrize("name", FUSED)
def test_one_stream_files_decode_one_call_per_layer(name):
    model = archrun.load(GOLDENS / f"{name}.gguf")
    assert model.fused_blocks is not None
    assert all(type(fb) is FusedBlock and not fb.dense for fb in model.fused_blocks)
    assert archrun.load(GOLDENS / f"{name}.gguf", backend="reference").fused_blocks is None


@pytest.mark.parametrize("name", ["gemma4_ple", "gemma4_moe"])
def test_per_layer_inputs_and_mixtures_decode_op_by_op(name):
    """A stream op (per-layer inputs) carries more than one array; gemma4_moe applies its own FFN norms: both
    stay op by op."""
    assert archrun.load(GOLDENS / f"{name}.gguf").fused_blocks is None


def test_a_mixture_of_experts_is_declined(q8):
    """The layer kernel runs a dense FFN only: given a mixture of experts (gemma4_moe applies its own FFN norms),
    fused_layer answers None (op by op) for projections it fuses otherwise."""
    model, _ = q8
    lp = model.plan.layers[0]
    assert lp.attention.fused_layer(lp.qkv, lp.o, None, None) is not None
    assert lp.attention.fused_layer(lp.qkv, lp.o, None, object()) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_layer_has_the_op_paths_bits(q8, threads):
    """Each layer that computes its own keys: its fused step against the op-by-op block on the same input and
    cache, the same output and cached rows, bit for bit (a layer reusing keys needs its source run first:
    test_layers_in_order_have_the_op_paths_bits)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = q8
    own = {id(fb) for fb, slot in zip(model.fused_blocks, model.init_cache(4).slots, strict=True)
           if not isinstance(slot, SharedSlot)}

    def same_rows(f, o):
        np.testing.assert_array_equal(f.k, o.k)
        np.testing.assert_array_equal(f.v, o.v)

    check_fused_steps(model, np.testing.assert_array_equal, same_rows, threads, select=lambda fb: id(fb) in own)


@pytest.mark.parametrize("slots", ["plain", "ring"])
@pytest.mark.parametrize("threads", [1, 2])
def test_layers_in_order_have_the_op_paths_bits(q8, threads, slots):
    """Every layer in model order (so a layer reusing keys runs after its source, as in a decode step), each
    given the same random input on both caches: the fused step's output has the op-by-op block's bits and both
    caches the same rows, on plain slots and on the sliding layers' rings until they wrap around. Past the wrap
    the outputs stay within float32 rounding: archrun-blocks' attention part reads a ring's rows in row order,
    its op-by-op attention the old rows first and the new one last (summed in another order)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = q8
    rng = np.random.default_rng(8)
    d, steps = model.descriptor.n_embd, 12
    max_rewind = 64 if slots == "plain" else 2  # rings of window + 2 rows (a wrap within the steps)
    ops, fused = (model.init_cache(steps + 4, max_rewind=max_rewind) for _ in range(2))
    source = [s.source if isinstance(s, SharedSlot) else s for s in ops.slots]
    assert any(isinstance(s, RingKvSlot) for s in source) == (slots == "ring")
    before = qmatrix.current_threads()
    qmatrix.set_threads(threads)
    try:
        for cache in (ops, fused):  # a 3-token prompt op by op on both
            rows = np.random.default_rng(2).standard_normal((3, d)).astype(np.float32)
            for i, lp in enumerate(model.plan.layers):
                model.run_block(lp, rows, cache.slots[i], 0, model.rope_angles(np.arange(3)))
        for pos in range(3, 3 + steps):
            angles = model.rope_angles(np.array([pos]))
            for i, (lp, fb) in enumerate(zip(model.plan.layers, model.fused_blocks, strict=True)):
                x = rng.standard_normal(d).astype(np.float32)
                want = model.run_block(lp, x[None].copy(), ops.slots[i], pos, angles)[0]
                fb(x, fused.slots[i], pos, angles)
                what = f"layer {i} at position {pos}"
                if isinstance(source[i], RingKvSlot) and pos >= source[i].size:  # wrapped: another order
                    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6, err_msg=what)
                else:
                    np.testing.assert_array_equal(x, want, err_msg=what)
                if not isinstance(ops.slots[i], SharedSlot):
                    for a, b in ((fused.slots[i].k, ops.slots[i].k), (fused.slots[i].v, ops.slots[i].v)):
                        np.testing.assert_array_equal(a, b, err_msg=what)
    finally:
        qmatrix.set_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_decode_is_the_op_by_op_decode(q8, threads):
    """Whole models token by token, fused against op by op (every layer and the head: the same bits), then again
    after a rewind (plain slots: see test_layers_in_order_have_the_op_paths_bits for rings); on two threads the
    fused steps' products go to the decode pool (every layer registers its product groups)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, path = q8
    assert all(fb.pooled for fb in model.fused_blocks)
    ops = archrun.load(path, fused=False)
    assert ops.fused_blocks is None
    ids = np.random.default_rng(6).integers(0, model.descriptor.n_vocab, 16)
    caches = [m.init_cache(24) for m in (model, ops)]
    before = qmatrix.current_threads()
    qmatrix.set_threads(threads)
    try:
        for m, cache in zip((model, ops), caches, strict=True):
            m.forward_step(ids[:3], cache)  # the prompt: op by op on both
        for t in (*ids[3:], "rewind", *ids[:5]):
            if t == "rewind":
                for cache in caches:
                    cache.rewind(2)
                continue
            a, b = (m.forward_step([t], cache) for m, cache in zip((model, ops), caches, strict=True))
            np.testing.assert_array_equal(a, b)
    finally:
        qmatrix.set_threads(before)


def test_f16_caches_decode_op_by_op(q8):
    """The layer kernel reads float32 caches: on f16 caches (q8_0 ones need head widths of multiples of 32, the
    sliding layers' are 16) a fused model's steps run op by op, with the op-by-op model's bits."""
    model, path = q8
    ops = archrun.load(path, fused=False)
    ids = np.random.default_rng(9).integers(0, model.descriptor.n_vocab, 8)
    caches = [m.init_cache(16, kv_type="f16") for m in (model, ops)]
    for t in ids:
        a, b = (m.forward_step([t], cache) for m, cache in zip((model, ops), caches, strict=True))
        np.testing.assert_array_equal(a, b)


def test_a_batch_is_each_sequence_alone(q8):
    """Batches of rows run op by op (a layer reusing keys reads its source's rows of each sequence): a batch
    of two sequences' next tokens gives each the logits of its fused step alone."""
    from archrun.conformance.kit import check_batch

    model, _ = q8
    check_batch(model, np.random.default_rng(10).integers(0, model.descriptor.n_vocab, 9), "gemma4 Q8_0 copy")


def test_long_contexts_split_the_attention(q8):
    """Past 128 visible rows archrun-blocks' attention part splits the keys into chunks merged by the
    log-sum-exp rule (its op-by-op attention sums them in one pass): up to 128 rows the fused steps have the
    op-by-op bits, past them the logits stay within float32 rounding (a layer reusing keys included)."""
    model, path = q8
    ops = archrun.load(path, fused=False)
    n = 140
    ids = np.random.default_rng(4).integers(0, model.descriptor.n_vocab, n)
    caches = [m.init_cache(n, max_rewind=n) for m in (model, ops)]  # plain slots: no ring wraps
    for m, cache in zip((model, ops), caches, strict=True):
        m.forward_step(ids[:124], cache)
    for pos in range(124, n):
        a, b = (m.forward_step([ids[pos]], cache) for m, cache in zip((model, ops), caches, strict=True))
        if pos < 128:  # pos + 1 visible rows
            np.testing.assert_array_equal(a, b, err_msg=f"position {pos}")
        else:
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max(), err_msg=f"position {pos}")
