"""Sparse-attention layers (attention="mla_dsa", DeepSeek-V3.2) decode fused (the fast op's `fused_layer`: one
kernel call per layer, dense FFN or mixture of experts) with the bits of the op-by-op path, on either side of
the indexer's top-k (positions below it read every key, the others the top_k the indexer picks).

On copies of archrun-deepseek32's tiny fixtures whose widths are made multiples of 32 (the q LoRA, which the
indexer's query reads too, the value heads, the experts: new random weights there) and whose block matrices,
the indexer's included, are Q8_0 (the fused and the op-by-op product kernels of a quantized type compute one
token alike; float32 products differ in rounding, numpy's BLAS against the decode kernel), each layer's fused
step gives the op-by-op block's output, latent rows and indexer keys bit for bit, on one thread and on two.
The indexer's selection in the kernel (kernels.dsa_layer: scores through numpy's own BLAS routines, top-k
with ties to the earlier keys) is checked against archrun_mla.indexer's on its own, ties included."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.kernels.decode.fusion import FusedBlock

GOLDENS = Path(__file__).resolve().parents[3] / "families" / "archrun-deepseek32" / "tests" / "goldens"
Q_LORA, V_HEAD, EXPERT_FF = 32, 16, 32
# tensor role -> its new numpy shape from the old one (widths as the fixtures have them: v_head_dim 12)
RESHAPED = {
    "attn_q_a": lambda s: (Q_LORA, s[1]), "attn_q_a_norm": lambda s: (Q_LORA,), "attn_q_b": lambda s: (s[0], Q_LORA),
    "indexer.attn_q_b": lambda s: (s[0], Q_LORA),
    "attn_v_b": lambda s: (s[0], V_HEAD, s[2]), "attn_output": lambda s: (s[0], s[1] // 12 * V_HEAD),
    "ffn_gate_exps": lambda s: (s[0], EXPERT_FF, s[2]), "ffn_up_exps": lambda s: (s[0], EXPERT_FF, s[2]),
    "ffn_down_exps": lambda s: (s[0], s[1], EXPERT_FF), "ffn_gate_shexp": lambda s: (EXPERT_FF, s[1]),
    "ffn_up_shexp": lambda s: (EXPERT_FF, s[1]), "ffn_down_shexp": lambda s: (s[0], EXPERT_FF)}
QUANTIZED = ("attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
             "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
             "ffn_gate_inp", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj")


def _role(name: str) -> str:
    """blk.N.<role>.weight -> role (indexer.attn_k, attn_q_a, ...); "" outside the blocks."""
    return ".".join(name.split(".")[2:-1]) if name.startswith("blk.") else ""


def _widened_q8_0(src: Path, dst: Path) -> Path:
    """src with 32-multiple widths (new random weights where a width changes) and Q8_0 block matrices."""
    import gguf

    r = gguf.GGUFReader(str(src))
    rng = np.random.default_rng(11)
    tensors = {}
    for t in r.tensors:
        role, a = _role(t.name), np.asarray(t.data, np.float32)
        if role in RESHAPED:
            shape = RESHAPED[role](a.shape)
            a = (rng.normal(1.0, 0.1, shape) if role.endswith("norm") else rng.normal(0, 0.15, shape))
            a = a.astype(np.float32)
        if role in QUANTIZED or t.name in ("output.weight", "token_embd.weight"):
            q8 = gguf.GGMLQuantizationType.Q8_0
            tensors[t.name] = (gguf.quants.quantize(a, q8), q8)
        elif role in RESHAPED:
            tensors[t.name] = a
    keys = {"deepseek32.attention.value_length_mla": V_HEAD, "deepseek32.expert_feed_forward_length": EXPERT_FF,
            "deepseek32.attention.q_lora_rank": Q_LORA}
    return rewrite_gguf(src, dst, drop_tensors=tuple(tensors), add_tensors=tensors, add_keys=keys)


@pytest.fixture(scope="module", params=["deepseek32_top16", "deepseek32_top24_16heads"])
def model(request, tmp_path_factory):
    """The fast model of a widened Q8_0 copy of the fixture: one (two) dense leading layers, then MoE layers
    (shared experts); 16 indexer heads of 64, top 16 (24)."""
    path = _widened_q8_0(GOLDENS / f"{request.param}.gguf", tmp_path_factory.mktemp("dsa") / f"{request.param}.gguf")
    return archrun.load(path), path


def test_sparse_attention_layers_decode_one_call_per_layer(model):
    from archrun_mla.kernels import dsa_layer

    model, _ = model
    assert model.fused_blocks is not None
    assert all(type(fb) is FusedBlock and not fb.dense for fb in model.fused_blocks)
    kernels = {fb._kernel for fb in model.fused_blocks}
    assert kernels == {dsa_layer.decode_dsa_layer, dsa_layer.decode_dsa_moe_layer}


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_sparse_attention_layer_has_the_op_paths_bits(model, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache, from two positions
    below the top-k (every key read) to three past it (the indexer's picks): the same output, the same cached
    [k_pe | latent] rows and indexer keys, bit for bit."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = model
    top_k = model.plan.layers[0].attention.top_k

    def same_slot(f, o):
        np.testing.assert_array_equal(f.k, o.k)
        np.testing.assert_array_equal(f.ik, o.ik)

    check_fused_steps(model, np.testing.assert_array_equal, same_slot, threads, context=top_k - 2, steps=6)


def test_fused_decode_is_the_op_by_op_decode(model):
    """Whole models token by token past the top-k, fused against op by op (every layer and the head: the same
    bits)."""
    model, path = model
    ops = archrun.load(path, fused=False)
    assert ops.fused_blocks is None
    top_k = model.plan.layers[0].attention.top_k
    ids = np.random.default_rng(6).integers(0, model.descriptor.n_vocab, top_k + 6)
    caches = [m.init_cache(len(ids)) for m in (model, ops)]
    for t in ids:
        a, b = (m.forward_step([t], cache) for m, cache in zip((model, ops), caches, strict=True))
        np.testing.assert_array_equal(a, b)


def test_the_selection_matters_on_these_copies(model):
    """Op by op reading every key (no indexer) differs from the fused decode past the top-k: the cases above
    check the kernel's selection, not only its dense attention."""
    model, path = model
    ops = archrun.load(path, fused=False)
    top_k = model.plan.layers[0].attention.top_k
    for lp in ops.plan.layers:
        lp.attention.top_k = 10 ** 6
    ids = np.random.default_rng(6).integers(0, model.descriptor.n_vocab, top_k + 3)
    caches = [m.init_cache(len(ids)) for m in (model, ops)]
    got = [[m.forward_step([t], cache) for t in ids] for m, cache in zip((model, ops), caches, strict=True)]
    np.testing.assert_array_equal(got[0][top_k - 1], got[1][top_k - 1])
    assert np.abs(got[0][-1] - got[1][-1]).max() > 1e-3


def test_one_indexer_head_decodes_op_by_op(tmp_path):
    """With one indexer head numpy scores through other routines (a vector times a matrix, then no BLAS at
    all), which the kernel does not copy: such layers decode op by op, and correctly."""
    import gguf

    src = GOLDENS / "deepseek32_top16.gguf"
    r = gguf.GGUFReader(str(src))
    rng = np.random.default_rng(2)
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in r.tensors}
    tensors = {}
    for name, shape in shapes.items():
        if _role(name) == "indexer.proj":
            tensors[name] = rng.normal(0, 0.15, (1, shape[1])).astype(np.float32)
        elif _role(name) == "indexer.attn_q_b":
            tensors[name] = rng.normal(0, 0.15, (shape[0] // 16, shape[1])).astype(np.float32)
    path = rewrite_gguf(src, tmp_path / "one_head.gguf", drop_tensors=tuple(tensors), add_tensors=tensors,
                        add_keys={"deepseek32.attention.indexer.head_count": 1})
    fast, ref = archrun.load(path), archrun.load(path, backend="reference")
    assert fast.plan.layers[0].attention.heads == 1 and fast.fused_blocks is None
    ids = np.random.default_rng(4).integers(0, fast.descriptor.n_vocab, 20)
    got, want = fast.logits(ids), ref.logits(ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("heads,width,count", [(16, 64, 17), (2, 8, 5), (16, 64, 300), (5, 24, 41)])
def test_kernel_scores_are_the_scorers_bits(heads, width, count):
    """The kernel's indexer scores of one query against archrun_mla.indexer.index_scores_chunked's (the op's)."""
    from archrun_mla import indexer
    from archrun_mla.kernels import blas, dsa_layer

    rng = np.random.default_rng(count)
    q = rng.normal(0, 1, (1, heads, width)).astype(np.float32)
    w = rng.normal(0, 1, (1, heads)).astype(np.float32)
    keys = rng.normal(0, 1, (count + 7, width)).astype(np.float32)  # rows past count: not read
    want = indexer.index_scores_chunked(q, w, keys[:count], np.array([count - 1]))[0]
    kscale = np.float32(1.0 / np.sqrt(width))
    got = dsa_layer.index_scores(q.reshape(-1), w[0], keys[:, None, :], count, kscale, (blas.sgemm(),),
                                 (blas.sgemv(),))
    np.testing.assert_array_equal(got, want)


def test_kernel_top_keys_break_ties_as_the_op():
    """The kernel's top-k against archrun_mla.indexer.top_keys on rows with many ties at the k-th place (scores
    of a few values, zeros of the ReLU among them)."""
    from archrun_mla import indexer
    from archrun_mla.kernels import dsa_layer

    rng = np.random.default_rng(5)
    for trial in range(200):
        count = int(rng.integers(2, 60))
        k = int(rng.integers(1, count))
        scores = rng.integers(-2, 3, count).astype(np.float32) * np.float32(0.5)
        if trial % 3 == 0:
            scores = rng.normal(0, 1, count).astype(np.float32)
        want = indexer.top_keys(scores[None], k)[0]
        np.testing.assert_array_equal(dsa_layer.top_keys(scores, k), want)
    scores = np.array([0.0, 2.0, 0.0, -1.0, 0.0, 1.0], np.float32)
    assert dsa_layer.top_keys(scores, 3).tolist() == [0, 1, 5]
