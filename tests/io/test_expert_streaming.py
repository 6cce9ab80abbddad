"""MoE experts streamed from disk (archrun.io.experts): a synthetic Qwen3-MoE (Q8_0 experts, written with the real
gguf writer) loaded with `expert_memory` 40 % below its expert bytes runs and gives the logits of the same file
with every expert resident, bit for bit (prompt, decode steps, a batch), while the pager keeps the resident
experts under the cap between steps. The reference is the resident load of the same file."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from support.synth import Quantized, chain, quantize, write_model

import archrun
from archrun.errors import InvalidRequest
from archrun.kernels.pages import ASKED

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _quantize_experts(t):
    for name, arr in t.items():
        if name.endswith("_exps.weight"):
            t[name] = Quantized(gguf.quants.quantize(np.ascontiguousarray(arr), Q8_0).view(np.uint8), int(Q8_0))
    return t


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("moe") / "moe.gguf", arch="qwen3moe", n_layer=3, n_embd=64, n_ff=64,
                       n_vocab=128, n_expert=16, n_expert_used=2, n_ff_exp=96,
                       transform=chain(quantize(Q8_0), _quantize_experts))


@pytest.fixture(scope="module")
def models(path):
    resident = archrun.load(path)
    experts = sum(m.prepared.nbytes for lp in resident.plan.layers
                  for m in (*lp.ffn.weights.gate, *lp.ffn.weights.up, *lp.ffn.weights.down))
    cap = int(0.6 * experts)
    return resident, archrun.load(path, expert_memory=cap), cap


def test_streamed_experts_equal_resident_ones_bitwise(models):
    resident, streamed, cap = models
    pager = streamed.plan.pager
    assert pager.store_bytes > cap / 0.6 * 0.99  # every expert matrix went to the store
    assert streamed.step_paths() == resident.step_paths()  # the same kernels (the fused MoE layer)
    rc, sc = resident.init_cache(96), streamed.init_cache(96)
    prompt = [(5 * i) % 120 + 3 for i in range(40)]
    assert np.array_equal(resident.forward_step(prompt, rc, all_logits=True),
                          streamed.forward_step(prompt, sc, all_logits=True))
    assert pager.resident_bytes() <= cap  # a prompt goes back under the cap after every layer
    for t in (9, 17, 33, 65, 101, 7, 8, 90):
        assert np.array_equal(resident.forward_step([t], rc), streamed.forward_step([t], sc))
    pager.between_steps()
    assert pager.evictions > 0 and pager.resident_bytes() <= cap  # paged: under the cap between steps
    rcs, scs = [resident.init_cache(16) for _ in range(4)], [streamed.init_cache(16) for _ in range(4)]
    spans = [[3 + i, 4, 5 + i] for i in range(4)]
    for u, v in zip(resident.forward_step_batch_spans(spans, rcs), streamed.forward_step_batch_spans(spans, scs),
                    strict=True):
        assert np.array_equal(u, v)


def test_the_routers_picks_are_read_ahead(models):
    """With every expert dropped, a decode step asks the OS for as many matrices as its routers pick (2 experts
    of 3 matrices in each of 3 layers), each of which it then reads; switched off, it asks for none.
    The logits are those of the resident model either way."""
    resident, streamed, cap = models
    pager = streamed.plan.pager
    rc, sc = resident.init_cache(32), streamed.init_cache(32)
    for model, c in ((resident, rc), (streamed, sc)):
        model.forward_step([3, 4, 5], c)
    try:
        for t, on in ((11, True), (12, False), (13, True)):
            pager.set_prefetch(on)
            pager.budget = 0
            pager.between_steps()  # every expert dropped: nothing mapped, no range flagged
            assert not pager.resident().any() and not pager.table[:, ASKED].any()
            assert np.array_equal(resident.forward_step([t], rc), streamed.forward_step([t], sc))
            asked = pager.table[:, ASKED] == 1
            assert asked.sum() == (3 * 2 * 3 if on else 0)
            if on:  # the asked ones were read by the step (the OS may map neighbouring pages in too)
                assert pager.resident()[asked].all()
    finally:
        pager.set_prefetch(True)
        pager.budget = cap


def test_bad_expert_memory_is_refused(path, tmp_path):
    for bad in (0, -5, True, 1.5, "1G"):
        with pytest.raises(InvalidRequest, match="expert_memory must be"):
            archrun.load(path, expert_memory=bad)
    with pytest.raises(InvalidRequest, match="fast backend"):
        archrun.load(path, expert_memory=1 << 20, backend="reference")
    dense = write_model(tmp_path / "dense.gguf")
    with pytest.raises(InvalidRequest, match="has none"):
        archrun.load(dense, expert_memory=1 << 20)


def test_the_cli_streams_experts(path, capsys):
    from archrun.cli import main

    args = ["run", str(path), "-p", "<t5><t6>", "-n", "3", "--temp", "0"]
    assert main(args) == 0
    resident = capsys.readouterr().out
    assert main([*args, "--expert-memory", "200K"]) == 0
    assert capsys.readouterr().out == resident  # the same greedy text
    assert main([*args, "--expert-memory", "lots"]) == 1
