"""Layer patterns are plugin data (archrun.describe.layers): a plugin adds a rule for which layers slide, have no
rope or are recurrent, without touching archrun; bad answers and duplicate names are PluginErrors."""

from __future__ import annotations

import pytest

from archrun.describe.compile import compile_gguf
from archrun.describe.layers import LayerPattern, layer_patterns
from archrun.errors import PluginError, UnknownVocabulary
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager

WINDOW = {"attention.sliding_window": 4}


def every_third_global(facts):
    """Layers 0, 1 slide, 2 is global, ... for qwen3 files with a window (a made-up family's rule)."""
    if facts.arch != "qwen3" or not facts.get("attention.sliding_window", int, 0):
        return None
    return [i % 3 < 2 for i in range(facts.n_layer)]


class ThirdGlobal:
    @hookimpl
    def archrun_register_layer_patterns(self, register):
        register("test-third-global", LayerPattern("sliding", every_third_global, rank=100))


def windows(path, pm):
    return [layer.attention.window for layer in compile_gguf(path, plugins=pm).descriptor.layers]


def test_a_plugin_adds_a_sliding_pattern(synth_model):
    path = synth_model(n_layer=4, key_overrides=WINDOW)
    assert windows(path, make_plugin_manager()) == [0, 0, 0, 0]  # qwen3 states no sliding layers
    assert windows(path, make_plugin_manager(extra=[ThirdGlobal()])) == [4, 4, 0, 4]
    other = synth_model(n_layer=4)  # no window: the rule does not answer, the built-in ones decide
    assert windows(other, make_plugin_manager(extra=[ThirdGlobal()])) == [0, 0, 0, 0]


def test_nope_follows_the_sliding_layers_a_plugin_decided(synth_model):
    """nope_global (a family hint the built-in nope pattern reads) sees the plugin's sliding layers."""
    path = synth_model(n_layer=3, key_overrides=WINDOW)
    d = compile_gguf(path, plugins=make_plugin_manager(extra=[ThirdGlobal()]), hints={"nope_global": True})
    d = d.descriptor
    assert [d.rope_tables[lay.attention.rope].pairing == "none" for lay in d.layers] == [False, False, True]


def test_an_answer_must_be_a_flag_per_layer(synth_model):
    class Short:
        @hookimpl
        def archrun_register_layer_patterns(self, register):
            register("test-short", LayerPattern("nope", lambda facts: [True], rank=100))

    with pytest.raises(PluginError, match="layer pattern 'test-short' answered list of length 1, not a flag per "
                                          "layer \\(2\\)"):
        compile_gguf(synth_model(n_layer=2), plugins=make_plugin_manager(extra=[Short()]))


def test_a_name_registered_twice_names_both_plugins():
    class Again:
        @hookimpl
        def archrun_register_layer_patterns(self, register):
            register("swa_period", LayerPattern("sliding", every_third_global))

    with pytest.raises(PluginError, match="layer pattern 'swa_period' is registered by both 'blocks' and"):
        layer_patterns(make_plugin_manager(names=["blocks"], extra=[Again()]))


def test_a_pattern_names_a_known_property():
    with pytest.raises(ValueError, match="property"):
        LayerPattern("chunked", every_third_global)


def test_without_any_pattern_nothing_compiles(synth_model):
    from archrun.family import TRANSFORMER

    bare = make_plugin_manager(names=[])
    hints = {"rope_pairing": "neox", "activation": "silu", "embed_scale": 1.0, **TRANSFORMER}
    with pytest.raises(UnknownVocabulary, match="no installed plugin registers layer patterns"):
        compile_gguf(synth_model(n_layer=2), plugins=bare, hints=hints)


def test_archrun_plugins_lists_the_data():
    from archrun.describe.inspect import list_plugins, render_plugins

    info = list_plugins()
    assert {"gpt-2", "llama3", "kimi-k2"} <= set(info["pre_tokenizers"])
    assert {"gpt2", "llama", "bert", "t5", "gemma4"} <= set(info["tokenizer_models"])
    assert {"property": "sliding", "name": "swa_period"}.items() <= next(
        p for p in info["layer_patterns"] if p["name"] == "swa_period").items()
    text = render_plugins(info)
    assert "pre-tokenizers (tokenizer.ggml.pre, " in text and "layer patterns (property, rank" in text
