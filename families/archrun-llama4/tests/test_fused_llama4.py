"""llama4 decodes fused: one kernel call per layer (archrun-llama4-ops' attention part in the core's dense
layer kernel, its input-weighted mixture's own layer kernel), against HF and with the op-by-op path's bits.

HF transformers is the oracle of the fused decode on the tiny fixtures (goldens/*.npz: its logits of the
golden ids). The op-by-op decode (the file loaded with fused=False) is the oracle of the bits: on copies of
the fixtures whose widths are made multiples of 32 (new random weights of the fixtures' structure: dense and
MoE layers, chunked and NoPE global layers, top-1 and top-2 experts, a shared expert) with Q8_0 matrices
(the fused and the op-by-op product kernels of a quantized type compute one token alike; float32 products
round differently, numpy's BLAS against the decode kernel), every layer's fused step and every decoded
token's logits are the same bits, on one thread and on two.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.hf import rel_err
from archrun.kernels.decode import layer, pool
from archrun.kernels.matmul import qmatrix
from archrun_llama4_ops.kernels import attention, moe

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("llama4_interleaved", "llama4_all_moe_top2")
Q8 = gguf.GGMLQuantizationType.Q8_0
# role -> (rows, columns) of the widened matrix in numpy order: d the embedding width, f the dense FFN's,
# e the experts' (and the shared expert's); None keeps the fixture's
SHAPES = {
    "token_embd": (None, "d"), "output": (None, "d"), "attn_q": (None, "d"), "attn_k": (None, "d"),
    "attn_v": (None, "d"), "attn_output": ("d", None), "ffn_gate": ("f", "d"), "ffn_up": ("f", "d"),
    "ffn_down": ("d", "f"), "ffn_gate_inp": (None, "d"), "ffn_gate_exps": ("e", "d"), "ffn_up_exps": ("e", "d"),
    "ffn_down_exps": ("d", "e"), "ffn_gate_shexp": ("e", "d"), "ffn_up_shexp": ("e", "d"), "ffn_down_shexp": ("d", "e"),
}


def _up32(n: int) -> int:
    return -(-n // 32) * 32


def widened_q8_0(name: str, dst: Path) -> Path:
    """The fixture `name` with its embedding, FFN and expert widths rounded up to multiples of 32 (new random
    weights of the same structure) and every matrix Q8_0."""
    src = GOLDENS / f"{name}.gguf"
    r = gguf.GGUFReader(str(src))
    keys = {"d": "llama4.embedding_length", "f": "llama4.feed_forward_length", "e": "llama4.expert_feed_forward_length"}
    width = {w: _up32(int(r.fields[k].contents())) for w, k in keys.items()}
    rng = np.random.default_rng(5)
    tensors = {}
    for t in r.tensors:
        role = t.name.split(".")[-2]
        shape = [int(x) for x in reversed(t.shape)]
        if role.endswith("norm"):
            tensors[t.name] = rng.normal(1.0, 0.1, width["d"]).astype(np.float32)
            continue
        rows, cols = SHAPES[role]
        shape[-2:] = [shape[-2] if rows is None else width[rows], shape[-1] if cols is None else width[cols]]
        a = (rng.standard_normal(shape) * (1.0 if role == "token_embd" else 0.15)).astype(np.float32)
        tensors[t.name] = (gguf.quants.quantize(a, Q8), Q8)
    return rewrite_gguf(src, dst, drop_tensors=tuple(tensors), add_tensors=tensors,
                        add_keys={keys[w]: v for w, v in width.items()})


def _kernels(model) -> list[str]:
    return ["moe" if fb._kernel is moe.decode_moe_layer else "dense" if fb._kernel is layer.decode_layer else "?"
            for fb in model.fused_blocks]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_decode_one_kernel_call_per_layer(name):
    """Dense layers run the core's layer kernel with the llama4 attention part, MoE layers this package's
    mixture layer kernel; the reference backend runs op by op."""
    m = archrun.load(GOLDENS / f"{name}.gguf")
    assert m.fused_blocks is not None
    want = ["moe" if lp.spec.is_moe else "dense" for lp in m.plan.layers]
    assert _kernels(m) == want and "moe" in want
    assert all(lp.attention.fused.fn is attention.llama4_attention for lp in m.plan.layers)
    assert archrun.load(GOLDENS / f"{name}.gguf", backend="reference").fused_blocks is None


@pytest.mark.parametrize("name", FIXTURES)
def test_fused_decode_matches_hf(name):
    golden = np.load(GOLDENS / f"{name}.npz")
    ids = golden["ids"].astype(np.int64)
    m = archrun.load(GOLDENS / f"{name}.gguf")
    assert m.fused_blocks is not None
    cache = m.init_cache(len(ids))
    steps = np.stack([m.forward_step([t], cache) for t in ids])
    assert rel_err(steps, golden["logits"]) <= 1e-4


@pytest.fixture(scope="module", params=FIXTURES)
def widened(request, tmp_path_factory):
    return widened_q8_0(request.param, tmp_path_factory.mktemp("llama4") / f"{request.param}_q8_0.gguf")


def _threads(n: int) -> None:
    if n > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_llama4_layer_has_the_op_paths_bits(widened, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache: the same output and
    the same cached keys and values, bit for bit."""
    _threads(threads)
    m = archrun.load(widened)
    assert _kernels(m).count("moe") >= 2

    def same_slot(f, o):
        np.testing.assert_array_equal(f.k, o.k)
        np.testing.assert_array_equal(f.v, o.v)

    check_fused_steps(m, np.testing.assert_array_equal, same_slot, threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_decode_is_the_op_by_op_decode(widened, threads):
    """Whole models token by token, fused against op by op (every layer and the head: the same bits); on two
    threads every layer's products are registered with the decode pool."""
    _threads(threads)
    m, ops = archrun.load(widened), archrun.load(widened, fused=False)
    assert m.fused_blocks is not None and ops.fused_blocks is None
    if threads > 1 and pool.enabled():  # the decode pool shares every layer's products
        assert m._decode._groups is not None and all(fb.dense or fb.pooled for fb in m.fused_blocks)
    ids = np.random.default_rng(6).integers(0, m.descriptor.n_vocab, 12)
    before = qmatrix.current_threads()
    qmatrix.set_threads(threads)
    try:
        caches = [x.init_cache(16) for x in (m, ops)]
        for t in ids:
            a, b = (x.forward_step([t], c) for x, c in zip((m, ops), caches, strict=True))
            np.testing.assert_array_equal(a, b)
    finally:
        qmatrix.set_threads(before)


def test_fused_decode_crosses_chunks_on_a_ring(tmp_path):
    """The interleaved fixture with 4-token chunks (attention.sliding_window 4): its chunked layers keep ring
    slots of 4 + 2 rows, which wrap, and every token attends only inside its chunk; the fused decode follows
    the reference backend (archrun-llama4-ops' numpy ops) through 20 tokens, at every cache kv type."""
    from archrun_blocks.reference import RingKvSlot

    path = rewrite_gguf(GOLDENS / "llama4_interleaved.gguf", tmp_path / "chunk4.gguf",
                        add_keys={"llama4.attention.sliding_window": 4})
    ids = np.random.default_rng(7).integers(0, 288, 20)
    ref = archrun.load(path, backend="reference")
    cache = ref.init_cache(32, max_rewind=2)
    want = np.stack([ref.forward_step([t], cache) for t in ids])
    m = archrun.load(path)
    assert m.fused_blocks is not None
    for kv_type in ("f32", "f16"):
        cache = m.init_cache(32, max_rewind=2, kv_type=kv_type)
        assert [isinstance(s, RingKvSlot) for s in cache.slots] == [True, True, True, False]
        assert m._decode.blocks_for(kv_type) is not None
        got = np.stack([m.forward_step([t], cache) for t in ids])
        # f16 rows round the cached keys and values (the reference stores f32)
        assert rel_err(got, want) <= (1e-4 if kv_type == "f32" else 3e-3), kv_type


@pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")
def test_a_long_context_splits_the_attention_with_the_same_bits_on_two_threads(tmp_path):
    """Past 128 visible rows the attention part splits its keys into chunks (the decode pool's task
    decode_attention.attend_chunk on two threads): the same logits bits on one thread and on two, and the op
    path's logits to float32 rounding (it attends in one pass)."""
    from archrun_blocks import decode_attention

    _threads(2)
    path = widened_q8_0("llama4_interleaved", tmp_path / "wide.gguf")
    m, ops = archrun.load(path), archrun.load(path, fused=False)
    assert decode_attention.attend_chunk in m._decode._tasks
    rng = np.random.default_rng(8)
    prompt, ids = rng.integers(0, m.descriptor.n_vocab, 150), rng.integers(0, m.descriptor.n_vocab, 6)
    before = qmatrix.current_threads()
    runs = []
    try:
        for model, threads in ((m, 1), (m, 2), (ops, 1)):
            qmatrix.set_threads(threads)
            cache = model.init_cache(160)
            model.forward_step(prompt, cache)
            runs.append(np.stack([model.forward_step([t], cache) for t in ids]))
    finally:
        qmatrix.set_threads(before)
    np.testing.assert_array_equal(runs[1], runs[0])
    assert rel_err(runs[0], runs[2]) <= 1e-5
