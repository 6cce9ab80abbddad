"""Core behaviour on the families' tiny HF fixtures (float32 GGUFs with HF transformers logits).

Each family package records and checks its own fixtures (families/<pkg>/tests/goldens, see
docs/testing.md); the core tests here and in other modules (fusion, sliding cache, MoE kernel)
reuse them through ``TINY`` (fixture name -> .gguf path; the .npz lies beside it).
"""

from __future__ import annotations

import pytest
from support.tiny import GEMMA, GLM, LEVEL0, TINY, fixtures, golden

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.hf import rel_err
from archrun.errors import UnsupportedArchitecture


def test_fixtures_are_found():
    for arch in (*LEVEL0, *GEMMA, *GLM):
        assert fixtures(arch), arch


@pytest.mark.parametrize("name", fixtures("qwen3")[:1])
def test_unknown_architecture_with_qwen3_layout_needs_hints_then_matches_hf(name, tmp_path):
    ids, ref = golden(name)
    path = rewrite_gguf(TINY[name], tmp_path / "renamed.gguf", architecture="qwen3-mystery")
    with pytest.raises(UnsupportedArchitecture) as err:
        archrun.load(path)
    for convention in ("rope_pairing", "activation", "residual", "attention", "embed_scale"):
        assert convention in str(err.value)
    hints = {"rope_pairing": "neox", "activation": "silu", "residual": "sequential", "attention": "causal",
             "embed_scale": 1}
    model = archrun.load(path, hints=hints)
    assert model.descriptor.architecture == "qwen3-mystery"
    assert rel_err(model.logits(ids), ref) <= 1e-4
    wrong = archrun.load(path, hints={**hints, "rope_pairing": "norm"})  # a convention matters: not guessed
    assert rel_err(wrong.logits(ids), ref) > 1e-3


@pytest.mark.parametrize("name", fixtures("qwen3")[:1])
def test_block_styles_give_the_same_logits_on_qwen3(name):
    ids, ref = golden(name)
    fused = archrun.load(TINY[name])
    host = archrun.load(TINY[name], block_style="host_reference")
    a = fused.logits(ids)
    b = host.host_step(ids, host.init_cache(len(ids))).logits
    assert rel_err(a, b) <= 1e-5 and rel_err(b, ref) <= 1e-4
