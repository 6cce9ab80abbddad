"""A mixture op may read per-layer parameters from the file (archrun.vocab.MoeLayout, `Op.layout` in slot
"moe"): the compiler asks its layout for each MoE layer and keeps the answer in MoeSpec.params, through
the descriptor's JSON round trip; an op without a layout has none."""

import json

from archrun.conformance.kit import descriptor_from_dict
from archrun.describe.compile import compile_gguf
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.vocab import Op


class FirstLayers:
    """params: "first" 1 for the layers below expert_used_count - 1, and the layer index."""

    def describe(self, ctx):
        used = ctx.meta.get("expert_used_count", int)
        return {"params": {"first": float(ctx.layer < used - 1), "layer": ctx.layer}}


def _topk(spec, gating, act):
    from archrun_blocks import reference

    return reference.moe_topk(spec, gating, act)


class Plugin:
    @hookimpl
    def archrun_register_vocabulary(self, register):
        register(Op("moe", "layered", _topk, None, "top-k with per-layer parameters (test)", layout=FirstLayers()))


def test_the_layout_gives_each_moe_layer_its_params(synth_model):
    path = synth_model(arch="qwen3moe", n_expert=4, n_expert_used=2, n_layer=3)
    d = compile_gguf(path, plugins=make_plugin_manager(extra=[Plugin()]), hints={"moe": "layered"}).descriptor
    assert [lay.ffn.params for lay in d.layers] == [(("first", 1.0), ("layer", 0.0)), (("first", 0.0), ("layer", 1.0)),
                                                    (("first", 0.0), ("layer", 2.0))]
    assert descriptor_from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_an_op_without_a_layout_has_no_params(synth_model):
    d = compile_gguf(synth_model(arch="qwen3moe", n_expert=4, n_expert_used=2)).descriptor
    assert all(lay.ffn.params == () for lay in d.layers)
