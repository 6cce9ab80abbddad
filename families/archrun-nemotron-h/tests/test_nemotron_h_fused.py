"""Nemotron-H's blocks without a token mixer (an MLP alone: archrun-blocks' "no_mixer", which declares `empty`) and
without an FFN (attention alone) decode fused on the fast backend beside its Mamba2 layers: the MLP layers run
the core's empty-mixer kernel (kernels.decode.layer.empty_mixer_layer: norm, FFN on the normed input, residual),
the attention layers the dense layer kernel with n_ff 0 (the residual's combine of the attention output and a
zero FFN output), with the bits of the op-by-op path.

Both fixtures themselves decode fused. Bits are compared on copies of them whose matrices are Q8_0 (the fused
and the op-by-op product kernels of a quantized type compute one token alike; float32 products round
differently; every width of these fixtures is already a multiple of 32): each layer's fused step gives the
op-by-op block's output and cached K rows bit for bit, on one thread and on two, and whole models token by
token give the same logits, one sequence and a batch of two."""

from __future__ import annotations

from pathlib import Path

import gguf
import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_decode_bits, check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.kernels.decode.fusion import EmptyMixerBlock, MixerBlock

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("nemotron_h_8b_pattern", "nemotron_h_nano_pattern")
Q8 = gguf.GGMLQuantizationType.Q8_0
MATRICES = ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_up.", "ffn_down.", "ssm_in.", "ssm_out.",
            "token_embd.", "output.")


@pytest.fixture(scope="module", params=FIXTURES)
def q8(request, tmp_path_factory) -> tuple:
    """(the fast model of a copy of the fixture with every matrix Q8_0, its path)."""
    src = GOLDENS / f"{request.param}.gguf"
    r = gguf.GGUFReader(str(src))
    tensors = {t.name: (gguf.quants.quantize(np.asarray(t.data, np.float32), Q8), Q8) for t in r.tensors
               if t.name.endswith(".weight") and any(f".{m}" in f".{t.name}" for m in MATRICES)}
    assert {n.split(".")[-2] for n in tensors} == {m.rstrip(".") for m in MATRICES}
    path = rewrite_gguf(src, tmp_path_factory.mktemp("nemotron_h") / f"{request.param}.gguf",
                        drop_tensors=tuple(tensors), add_tensors=tensors)
    return archrun.load(path), path


def _kinds(model) -> list[str]:
    out = []
    for lp, fb in zip(model.plan.layers, model.fused_blocks, strict=True):
        if isinstance(fb, EmptyMixerBlock):
            out.append("mlp")
        elif isinstance(fb, MixerBlock):
            out.append("mamba2")
        else:
            assert fb.dense and lp.ffn is None
            out.append("attention")
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_decode_one_call_per_layer(name):
    model = archrun.load(GOLDENS / f"{name}.gguf")
    assert model.fused_blocks is not None and len(model.fused_blocks) == model.descriptor.n_layer
    want = {"nemotron_h_8b_pattern": "M-M*-M-", "nemotron_h_nano_pattern": "*-MM-*M"}[name]
    assert "".join({"mlp": "-", "mamba2": "M", "attention": "*"}[k] for k in _kinds(model)) == want
    assert archrun.load(GOLDENS / f"{name}.gguf", backend="reference").fused_blocks is None


def _same_slot(f, o) -> None:
    if hasattr(o, "k"):  # an attention layer's cached keys (the others: a Mamba2 state, an empty slot)
        np.testing.assert_array_equal(f.k, o.k)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_layer_has_the_op_paths_bits(q8, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache (5 rows of context, then
    4 steps)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = q8
    assert {"mlp", "attention"} <= set(_kinds(model))
    check_fused_steps(model, np.testing.assert_array_equal, _same_slot, threads)


def test_fused_decode_is_the_op_by_op_decode(q8):
    """Whole models token by token, fused against op by op (every layer and the head: the same bits), and a
    batch of two sequences against their single steps."""
    model, path = q8
    ids = check_decode_bits(model, path, 10)
    singles, batched = [model.init_cache(16) for _ in range(2)], [model.init_cache(16) for _ in range(2)]
    for step in range(4):
        tokens = [int(ids[step]), int(ids[-1 - step])]
        want = [model.forward_step([t], c) for t, c in zip(tokens, singles, strict=True)]
        got = model.forward_step_batch([[t] for t in tokens], batched)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
