"""pluggy hook specifications of archrun (specs only).

Hooks are grouped by phase. Enumerate-many hooks receive a `register` callback and are
called on every plugin; the host owns de-duplication and errors. Pick-one hooks are
`firstresult=True`: the first non-None answer wins (plugins registered later are asked
first, as pluggy orders them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("archrun")
hookimpl = pluggy.HookimplMarker("archrun")  # what plugins mark their implementations with


# -- vocabulary (load time, collect-all) ---------------------------------------------------


@hookspec
def archrun_register_vocabulary(register: Callable[..., None]) -> None:
    """Register vocabulary ops.  Called once per plugin manager on every plugin (again only
    after a plugin was registered into it or unregistered).

    Call ``register(op)`` with an `archrun.vocab.Op` for each (slot, name) the plugin
    provides. Registering a (slot, name) that another plugin already provides raises
    `archrun.errors.PluginError` naming both plugins.
    """


# -- text and layer data (load time, collect-all) --------------------------------------------


@hookspec
def archrun_register_pre_tokenizers(register: Callable[..., None]) -> None:
    """Register pre-tokenizers.  Called once per plugin manager on every plugin.

    Call ``register(name, pre)`` with a `tokenizer.ggml.pre` value and an
    `archrun.text.tokenizer.PreTokenizer` (its regexes or splitters and llama.cpp's flags for it).
    Registering a name another plugin already provides raises `archrun.errors.PluginError`
    naming both plugins.
    """


@hookspec
def archrun_register_tokenizer_models(register: Callable[..., None]) -> None:
    """Register vocabulary kinds.  Called once per plugin manager on every plugin.

    Call ``register(name, build)`` with a `tokenizer.ggml.model` value and its builder:
    ``build(source: archrun.text.tokenizer.TokenizerSource) -> archrun.text.tokenizer.TokenizerParts``.
    Registering a name another plugin already provides raises `archrun.errors.PluginError`
    naming both plugins.
    """


@hookspec
def archrun_register_layer_patterns(register: Callable[..., None]) -> None:
    """Register layer patterns.  Called once per plugin manager on every plugin.

    Call ``register(name, pattern)`` with an `archrun.describe.layers.LayerPattern`: a rule that says, from
    a file's metadata and its family's hints, which layers have a property (recurrent, sliding,
    nope). Registering a name another plugin already provides raises
    `archrun.errors.PluginError` naming both plugins.
    """


# -- families (compile time) ----------------------------------------------------------------


@hookspec(firstresult=True)
def archrun_describe_family(architecture: str) -> Any:
    """Return an `archrun.family.FamilyHints` for a `general.architecture` string, or None.

    firstresult: the first plugin that knows the architecture answers. The hints carry only
    what a GGUF file does not say (its conventions: rope pairing, activation, residual
    topology, ...; per-family defaults, tensor-role aliases, block style); they never carry math.
    """


@hookspec
def archrun_families() -> list[str]:
    """Return the architecture strings this plugin describes (collect-all; for listings)."""


# -- generic layers (generation time, collect-all) ------------------------------------------


@hookspec
def archrun_register_drafters(register: Callable[..., None]) -> None:
    """Register speculative-decoding drafters.  Called once per lookup on every plugin.

    Call ``register(name, factory, doc="")``: ``factory(model, arg)`` returns an
    `archrun.generation.speculative.Drafter` for a target model (``arg`` is the text after ``name:`` in a
    spec such as ``draft:PATH``, or None). Registering a name another plugin already provides
    raises `archrun.errors.PluginError` naming both plugins.
    """


@hookspec(firstresult=True)
def archrun_tool_call_format(architecture: str, chat_template: str | None) -> Any:
    """Return an `archrun.generation.tools.ToolCallFormat` for a model, or None.  firstresult.

    Called when a chat offers tools. ``architecture`` is the file's `general.architecture`,
    ``chat_template`` the template the chat renders with (the file's or the family default; None
    if neither). The format parses the model's tool-call syntax into calls and writes the grammar
    of one call (used when `tool_choice` forces a call). The first plugin that answers wins.
    """


@hookspec(firstresult=True)
def archrun_reasoning_format(architecture: str, chat_template: str | None) -> Any:
    """Return an `archrun.text.reasoning.ReasoningFormat` for a model, or None.  firstresult.

    Asked once per served model (and per chat that splits reasoning). ``architecture`` is the
    file's `general.architecture`, ``chat_template`` the template the chat renders with (None if
    none). The format names the texts that open and close the model's thinking; replies are split
    into reasoning and answer along them. The first plugin that answers wins.
    """
