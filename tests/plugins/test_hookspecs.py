"""Meta-tests of the hook specifications: each hookspec has a section of docs/plugins.md headed by its exact
signature and call semantics, and a behavioural test that registers a plugin implementing it and observes
what the hook changes (BEHAVIOURS below: one per hookspec)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import attrs
import numpy as np
import pytest

import archrun
from archrun import hookspecs
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.vocab import Op

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "families/archrun-llama/tests/goldens/llama_gqa.gguf"
SPECS = sorted(n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("archrun_"))


def signature(name: str) -> str:
    """``name(param: annotation, ...) -> annotation`` as hookspecs.py declares it."""
    sig = inspect.signature(getattr(hookspecs, name))
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


def semantics(name: str) -> str:
    first = getattr(make_plugin_manager(names=[]).hook, name).spec.opts["firstresult"]
    return "firstresult" if first else "collect-all"


def documented() -> dict[str, tuple[str, str]]:
    """hook name -> (signature, semantics) of each ``### `signature` — semantics`` heading of docs/plugins.md."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    found = re.findall(r"^### `((archrun_\w+)\(.*\) -> .+)` — (firstresult|collect-all)\s*$", text, re.M)
    return {name: (sig, sem) for sig, name, sem in found}


def test_every_hookspec_has_a_doc_section_with_its_exact_signature():
    docs = documented()
    assert sorted(docs) == SPECS, f"docs/plugins.md documents {sorted(docs)}; hookspecs.py declares {SPECS}"
    for name in SPECS:
        assert getattr(hookspecs, name).__doc__, f"{name} has no docstring"
        assert docs[name] == (signature(name), semantics(name)), \
            f"docs/plugins.md: {docs[name]} != the hookspec's {(signature(name), semantics(name))}"


def test_every_hookspec_has_a_behavioural_test():
    assert sorted(BEHAVIOURS) == SPECS, f"hookspecs without a behavioural test: {sorted(set(SPECS) - set(BEHAVIOURS))}"


# ------------------------------------------------------------------------------ behaviours


def _ids() -> np.ndarray:
    return np.arange(1, 9, dtype=np.int64)


def register_vocabulary(monkeypatch) -> None:
    """A plugin's op is registered, bound once per layer when a model names it, and runs."""
    bound, calls = [], []

    def relu_glu():  # the factory: called when the plan is built
        bound.append(1)

        def act(x, up=None):
            calls.append(x.shape)
            y = np.maximum(x, np.float32(0))
            return y if up is None else y * up
        return act

    class Probe:
        @hookimpl
        def archrun_register_vocabulary(self, register):
            register(Op("activation", "probe_relu_glu", relu_glu, doc="max(x, 0) * up"))

    pm = make_plugin_manager(extra=[Probe()])
    model = archrun.load(FIXTURE, backend="reference", plugins=pm, hints={"activation": "probe_relu_glu"})
    got = model.logits(_ids())
    assert len(bound) == len(model.descriptor.layers) and calls, "the registered op was not bound and run"
    plain = archrun.load(FIXTURE, backend="reference").logits(_ids())
    assert np.abs(got - plain).max() > 1e-3, "the model computes the same with the plugin's activation"


def describe_family(monkeypatch) -> None:
    """firstresult: a plugin registered after the family answers first, and its conventions are used."""
    stock = make_plugin_manager()
    llama = stock.hook.archrun_describe_family(architecture="llama")
    asked = []

    class Probe:
        @hookimpl
        def archrun_describe_family(self, architecture):
            asked.append(architecture)
            return attrs.evolve(llama, rope_pairing="neox") if architecture == "llama" else None

    pm = make_plugin_manager(extra=[Probe()])
    model = archrun.load(FIXTURE, backend="reference", plugins=pm)
    assert "llama" in asked and model.descriptor.rope_tables[0].pairing == "neox"
    assert archrun.load(FIXTURE, backend="reference").descriptor.rope_tables[0].pairing == "norm"


def families(monkeypatch, capsys) -> None:
    """The architectures a plugin lists appear in `archrun plugins` under its name."""
    from archrun import cli
    from archrun.describe import inspect as archrun_inspect

    class Probe:
        @hookimpl
        def archrun_families(self):
            return ["probe-arch"]

    pm = make_plugin_manager(names=["blocks"], extra=[Probe()])
    monkeypatch.setattr(archrun_inspect, "default_plugin_manager", lambda: pm)
    assert cli.main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["families"]
    assert ["probe-arch"] in listed.values()


def register_drafters(monkeypatch) -> None:
    """A plugin's drafter is found by name and built by its factory with the spec's argument."""
    from archrun.generation.speculative import LookupDrafter, make_drafter

    built = []

    class Probe:
        @hookimpl
        def archrun_register_drafters(self, register):
            register("probe", lambda model, arg: built.append((model, arg)) or LookupDrafter(), "a probe")

    model = archrun.load(FIXTURE, backend="reference")
    drafter = make_drafter(model, "probe:xyz", make_plugin_manager(names=[], extra=[Probe()]))
    assert isinstance(drafter, LookupDrafter) and built == [(model, "xyz")]


def tool_call_format(monkeypatch) -> None:
    """firstresult: a format a later plugin declares replaces the family's; it splits replies and forces calls."""
    from archrun.generation.grammar import Grammar
    from archrun.generation.tools import Tool, ToolCallFormat, ToolCallStream, tool_format

    class Bang(ToolCallFormat):
        triggers = ("!call ",)

        def parse(self, section, final):
            name, _, args = section.removeprefix("!call ").partition(" ")
            return [(name, args)] if final else []

        def grammar(self, tools):
            return Grammar.regex(f"!call ({'|'.join(t.name for t in tools)}) [{{}}]+")

    class Probe:
        @hookimpl
        def archrun_tool_call_format(self, architecture, chat_template):
            return Bang() if architecture == "llama" else None

    model = archrun.load(FIXTURE, backend="reference")
    assert type(tool_format(model, make_plugin_manager())).__name__ == "Llama3ToolCalls"  # the family's
    fmt = tool_format(model, make_plugin_manager(extra=[Probe()]))
    assert isinstance(fmt, Bang)
    stream = ToolCallStream(fmt)
    assert stream.push("Sure. !ca") == ("Sure.", [])  # text that may open a call is held back
    assert stream.push("ll f {}")[0] == ""
    content, calls = stream.finish()
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", "{}")]
    assert fmt.grammar([Tool("f", "", {})]).source == "regex"


def reasoning_format(monkeypatch) -> None:
    """firstresult: the llama family answers for a template that thinks in <think>; a later plugin's format
    replaces it; a reply is split into reasoning and answer along the format's texts."""
    from archrun.text.reasoning import THINK_TAGS, ReasoningFormat, ReasoningStream
    from archrun.text.reasoning import reasoning_format as find

    class Probe:
        @hookimpl
        def archrun_reasoning_format(self, architecture, chat_template):
            return ReasoningFormat("[[", "]]") if architecture == "llama" else None

    model = archrun.load(FIXTURE, backend="reference")
    assert find(model, make_plugin_manager(), template="{{ '<think>' }}") == THINK_TAGS
    assert find(model, make_plugin_manager(), template="{{ messages }}") is None  # no thinking in the template
    fmt = find(model, make_plugin_manager(extra=[Probe()]), template="{{ messages }}")
    stream = ReasoningStream(fmt)
    assert stream.push("[[why") == ("why", "")
    assert stream.push("]") == ("", "")  # may close the thinking: held back
    assert stream.push("] so.") == ("", "so.")


def _fixture_metadata() -> dict:
    from archrun.io.ggufset import open_gguf

    gguf = open_gguf(FIXTURE)
    try:
        return dict(gguf.metadata)
    finally:
        gguf.close()


def register_pre_tokenizers(monkeypatch) -> None:
    """collect-all: a file whose tokenizer.ggml.pre names a plugin's pre-tokenizer splits with it (one
    piece per character here: no merge joins two characters)."""
    from archrun.text.tokenizer import PreTokenizer, Tokenizer, pre_tokenizers

    class Probe:
        @hookimpl
        def archrun_register_pre_tokenizers(self, register):
            register("probe-chars", PreTokenizer((".",)))

    meta = _fixture_metadata()
    stock = Tokenizer.from_metadata(meta, make_plugin_manager())
    pm = make_plugin_manager(extra=[Probe()])
    assert "probe-chars" in pre_tokenizers(pm) and "probe-chars" not in pre_tokenizers(make_plugin_manager())
    probe = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "probe-chars"}, pm)
    text = "Hello world"
    assert len(stock.encode(text, add_special=False)) < len(text)
    assert len(probe.encode(text, add_special=False)) == len(text)
    assert probe.decode(probe.encode(text, add_special=False)) == text


def register_tokenizer_models(monkeypatch) -> None:
    """collect-all: a plugin's vocabulary kind builds the tokenizer of a file whose tokenizer.ggml.model
    names it."""
    from archrun.errors import TokenizerError
    from archrun.text.tokenizer import Tokenizer, TokenizerParts

    class Reversed:
        def __init__(self, index):
            self.index = index

        def bind(self, ids, attrs):
            pass

        def encode(self, fragments):
            return [[self.index[c] for c in reversed(text)] for text in fragments]

    class Probe:
        @hookimpl
        def archrun_register_tokenizer_models(self, register):
            register("probe-reversed", lambda src: TokenizerParts(None, Reversed(src.index), {}, {
                "add_bos": False, "force_bos": False, "clean_spaces": False, "unescape_spaces": True,
                "add_space_prefix": False}))

    meta = {"tokenizer.ggml.model": "probe-reversed", "tokenizer.ggml.tokens": ["a", "b", "c"]}
    with pytest.raises(TokenizerError, match="unsupported tokenizer model 'probe-reversed'"):
        Tokenizer.from_metadata(meta, make_plugin_manager())
    tok = Tokenizer.from_metadata(meta, make_plugin_manager(extra=[Probe()]))
    assert tok.encode("abc", add_special=False) == [2, 1, 0]


def register_layer_patterns(monkeypatch) -> None:
    """collect-all: a plugin's pattern, ranked above the built-in ones, decides which layers of a llama
    file have no rope; without it every layer rotates."""
    from archrun.describe.compile import compile_gguf
    from archrun.describe.layers import LayerPattern
    from archrun.descriptor import NO_ROPE

    def first_layer(facts):
        return [i == 0 for i in range(facts.n_layer)] if facts.arch == "llama" else None

    class Probe:
        @hookimpl
        def archrun_register_layer_patterns(self, register):
            register("probe-nope", LayerPattern("nope", first_layer, rank=100))

    def pairings(pm):
        d = compile_gguf(FIXTURE, plugins=pm).descriptor
        return [d.rope_tables[layer.attention.rope].pairing for layer in d.layers]

    assert NO_ROPE not in pairings(make_plugin_manager())
    probed = pairings(make_plugin_manager(extra=[Probe()]))
    assert probed[0] == NO_ROPE and NO_ROPE not in probed[1:]


BEHAVIOURS = {
    "archrun_register_vocabulary": register_vocabulary,
    "archrun_register_pre_tokenizers": register_pre_tokenizers,
    "archrun_register_tokenizer_models": register_tokenizer_models,
    "archrun_register_layer_patterns": register_layer_patterns,
    "archrun_describe_family": describe_family,
    "archrun_families": families,
    "archrun_register_drafters": register_drafters,
    "archrun_tool_call_format": tool_call_format,
    "archrun_reasoning_format": reasoning_format,
}


@pytest.mark.parametrize("hook", SPECS)
def test_hook_behaviour(hook, monkeypatch, capsys):
    behaviour = BEHAVIOURS.get(hook)
    if behaviour is None:
        pytest.fail(f"{hook} has no behavioural test (BEHAVIOURS)")
    kwargs = {"capsys": capsys} if "capsys" in inspect.signature(behaviour).parameters else {}
    behaviour(monkeypatch, **kwargs)
