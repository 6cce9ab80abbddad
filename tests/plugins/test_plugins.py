import pytest

from archrun.errors import PluginError, UnknownVocabulary
from archrun.hookspecs import hookimpl
from archrun.plugins import installed_plugins, make_plugin_manager
from archrun.vocab import Op, build_vocabulary


def test_installed_plugins_are_registered():
    names = installed_plugins()
    assert {"blocks", "qwen", "llama"} <= set(names)
    pm = make_plugin_manager()
    for name in names:
        assert pm.get_plugin(name) is not None


def test_whitelist_env_var_limits_loaded_plugins(monkeypatch):
    monkeypatch.setenv("ARCHRUN_PLUGINS", "blocks")
    pm = make_plugin_manager()
    assert pm.get_plugin("blocks") is not None
    assert pm.get_plugin("qwen") is None
    assert pm.hook.archrun_describe_family(architecture="qwen3") is None


def test_explicit_names_override_env(monkeypatch):
    monkeypatch.setenv("ARCHRUN_PLUGINS", "blocks")
    pm = make_plugin_manager(names=["blocks", "qwen"])
    assert pm.hook.archrun_describe_family(architecture="qwen3").name == "qwen3"


def test_duplicate_vocabulary_is_a_plugin_error():
    class Dup:
        @hookimpl
        def archrun_register_vocabulary(self, register):
            register(Op("norm", "rms", lambda eps: None))

    pm = make_plugin_manager(names=["blocks"], extra=[Dup()])
    with pytest.raises(PluginError, match="norm='rms'.*blocks"):
        build_vocabulary(pm)


def test_unknown_vocabulary_names_alternatives():
    vocab = build_vocabulary(make_plugin_manager(names=["blocks"]))
    with pytest.raises(UnknownVocabulary, match="rope='yarn2'.*neox, norm"):
        vocab.entry("rope", "yarn2")


def test_third_party_op_is_registered_and_attributed():
    class Mine:
        @hookimpl
        def archrun_register_vocabulary(self, register):
            register(Op("activation", "squareplus", lambda: None, doc="(x + sqrt(x^2 + 4)) / 2"))

    vocab = build_vocabulary(make_plugin_manager(names=["blocks"], extra=[Mine()]))
    assert ("activation", "squareplus") in vocab
    assert vocab.entry("activation", "squareplus").plugin != "blocks"
    assert vocab.entry("activation", "silu").plugin == "blocks"


def test_families_hook_lists_architectures():
    pm = make_plugin_manager()
    archs = {a for lst in pm.hook.archrun_families() for a in lst}
    assert {"qwen2", "qwen3", "qwen3moe", "llama"} <= archs


def test_drafters_are_registered_through_a_hook():
    from archrun.generation.speculative import LookupDrafter, drafters

    class Mine:
        @hookimpl
        def archrun_register_drafters(self, register):
            register("echo", lambda model, arg: LookupDrafter(), "proposes what followed the last n-gram")

    found = drafters(make_plugin_manager(names=["glm4moe"], extra=[Mine()]))
    assert {"lookup", "draft", "mtp", "echo"} <= set(found)
    assert found["echo"][1].startswith("proposes")

    class Dup:
        @hookimpl
        def archrun_register_drafters(self, register):
            register("lookup", lambda model, arg: LookupDrafter())

    with pytest.raises(PluginError, match="'lookup' is registered by both archrun and"):
        drafters(make_plugin_manager(names=[], extra=[Dup()]))


def test_vocabulary_hook_runs_once_per_plugin_manager():
    """Documented in hookspecs: once per plugin manager, again only after its plugins change."""
    from pathlib import Path

    from archrun.describe.compile import compile_gguf

    calls = []

    class Counting:
        @hookimpl
        def archrun_register_vocabulary(self, register):
            calls.append(1)

    pm = make_plugin_manager(names=["blocks", "llama"], extra=[Counting()])
    fixture = Path(__file__).resolve().parents[2] / "families/archrun-llama/tests/goldens/llama_gqa.gguf"
    first = build_vocabulary(pm)
    compile_gguf(fixture, plugins=pm)
    assert build_vocabulary(pm) is first and len(calls) == 1
    pm.register(Counting(), name="another")
    assert build_vocabulary(pm) is not first and len(calls) == 3  # both Counting plugins, once each
