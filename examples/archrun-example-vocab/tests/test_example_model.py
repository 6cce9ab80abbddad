"""What the conformance kit (conftest.py) does not ask: the quickgelu-llama variants really use this package's
family and op in every layer, experts included, and the family's default softcap."""

from __future__ import annotations

import pytest
from quickgelu_model import ARCH, DEFAULT_SOFTCAP, VARIANTS

import archrun
from archrun.conformance import synthetic
from archrun.descriptor import MoeSpec


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_family_and_op_are_used(variant, tmp_path):
    model = archrun.load(synthetic.write(tmp_path / "m.gguf", variant), backend="fast")
    d = model.descriptor
    assert d.architecture == ARCH and d.n_layer == variant.n_layer
    assert all(layer.ffn.activation == "gelu_quick" for layer in d.layers)
    assert d.logit_softcap == DEFAULT_SOFTCAP and d.softcap == "tanh"
    moe = [layer.ffn for layer in d.layers if isinstance(layer.ffn, MoeSpec)]
    assert len(moe) == (variant.n_layer - variant.leading_dense if variant.n_expert else 0)
    assert all(m.gating == "softmax" and m.weights_norm for m in moe)
    assert model.plan.providers["activation=gelu_quick"] == "example_vocab"
