"""A mixture op that declares `own_ffn_norm` (archrun.contracts) is called on the FFN branch's input before the
block's FFN norm, which it applies itself (Gemma 4's mixture blocks route on the unnormed stream).

The test op ("raw_topk") records its inputs and runs archrun-blocks' top-k mixture on them after applying the
block's FFN norm, which it binds: the model must equal the same file under plain top-k bit for bit, and the
op must have seen the unnormed branch input."""

from __future__ import annotations

import numpy as np
import pytest

import archrun
from archrun.contracts import OpCapabilities
from archrun.errors import PluginError
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.vocab import Op, build_vocabulary

IDS = np.array([5, 17, 3, 42, 8, 60, 11, 2, 29, 4])


class RawTopk:
    inputs: list = []

    def __init__(self, spec, gating, act):
        from archrun_blocks import reference

        self.topk = reference.moe_topk(spec, gating, act)

    def bind(self, binder, layer):
        self.norm = binder.op("norm", binder.d.norm, binder.d.norm_eps)
        self.weight = binder.norm_weight("ffn_norm", layer)

    def __call__(self, g, weights):
        RawTopk.inputs.append(np.array(g))
        return self.topk(self.norm(g, self.weight), weights)


def _plugin(**caps):
    class Plugin:
        @hookimpl
        def archrun_register_vocabulary(self, register):
            register(Op("moe", "raw_topk", RawTopk, None, "top-k on the unnormed FFN input (test)",
                        capabilities=OpCapabilities(**caps)))

    return Plugin()


@pytest.fixture
def moe_file(synth_model):
    return synth_model(arch="qwen3moe", n_expert=4, n_expert_used=2, n_layer=2)


def test_the_op_applies_the_ffn_norm_itself(moe_file):
    RawTopk.inputs.clear()
    pm = make_plugin_manager(extra=[_plugin(binds=True, own_ffn_norm=True)])
    m = archrun.load(moe_file, backend="reference", plugins=pm, hints={"moe": "raw_topk"})
    want = archrun.load(moe_file, backend="reference")
    np.testing.assert_array_equal(m.logits(IDS), want.logits(IDS))
    # what it saw: the branch input g = x + attention branch (first layer), not a normed one
    x = want.embed(IDS, 0)
    angles = want.rope_angles(np.arange(len(IDS)))
    cache = want.init_cache(len(IDS))
    lp = want.plan.layers[0]
    g = x + want.run_block(lp, x, cache.slots[0], 0, angles, "attention")
    np.testing.assert_array_equal(RawTopk.inputs[0], g)


@pytest.mark.parametrize(("caps", "match"), [({"own_ffn_norm": True}, "without binds"),
                                             ({"own_ffn_norm": True, "binds": True, "fused_layer": True},
                                              "own_ffn_norm and fused_layer")])
def test_a_declaration_the_core_cannot_honour_is_refused(caps, match):
    if caps.get("fused_layer"):  # a kernel member needs a fast factory: give the op one
        class Fast:
            @hookimpl
            def archrun_register_vocabulary(self, register):
                register(Op("moe", "raw_topk", RawTopk, RawTopk, "", capabilities=OpCapabilities(**caps)))

        plugin = Fast()
    else:
        plugin = _plugin(**caps)
    with pytest.raises(PluginError, match=match):
        build_vocabulary(make_plugin_manager(extra=[plugin]))
