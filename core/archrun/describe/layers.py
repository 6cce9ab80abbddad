"""Layer patterns: which layers of a model have a property, by rules plugins register.

A model's layers differ in four properties (HF's `layer_types`, llama.cpp's per-layer flags):
``mixerless`` (no token mixer at all: the block is norm -> FFN -> residual, Nemotron-H's MLP
layers; the family's `mixerless` convention names the op standing in the mixer's place),
``recurrent`` (a token mixer runs instead of attention), ``sliding`` (attention within a window)
and ``nope`` (no rotary embedding). Which layers have them is data — the file's keys and its
family's hints (archrun.family.FamilyHints) — read by rules that plugins register through
`archrun_register_layer_patterns`; the compiler names none of them.

For each property, in the order of PROPERTIES, the compiler asks the registered patterns of that
property, highest `rank` first (then by name); the first whose rule answers (a flag per layer)
decides, and when none answers no layer has the property. A pattern that only applies to some
architectures answers None for the others. A rule sees a `LayerFacts`: the file's `<arch>.*` keys
(reading one marks it used), the per-layer head counts, the family's hints, and the flags of the
properties decided before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from archrun.errors import MetadataError, PluginError, UnknownVocabulary

PROPERTIES = ("mixerless", "recurrent", "sliding", "nope")


@attrs.frozen
class LayerPattern:
    """A rule for one property: ``rule(facts: LayerFacts) -> flags | None`` (a bool per layer)."""

    property: str = attrs.field(validator=attrs.validators.in_(PROPERTIES))
    rule: Callable[[LayerFacts], Sequence[bool] | None] = attrs.field(validator=attrs.validators.is_callable())
    rank: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))
    doc: str = ""


class LayerFacts:
    """What a layer pattern's rule may read about one model."""

    def __init__(self, meta: Any, hints: Any, n_layer: int, heads: tuple[int, ...], heads_kv: tuple[int, ...],
                 max_layers: int):
        self._meta, self._max_layers = meta, max_layers
        self.arch: str = meta.arch
        self.hints = hints  # archrun.family.FamilyHints
        self.n_layer = n_layer
        self.heads, self.heads_kv = heads, heads_kv  # per layer (attention.head_count[_kv]; kv 0 when absent)
        self._decided: dict[str, tuple[bool, ...]] = {}

    def has(self, name: str) -> bool:
        """Whether the file has `<arch>.<name>` (a gguf-py key name, e.g. "full_attention_interval")."""
        return self._meta.has(name)

    def get(self, name: str, kind: type, default: Any = ...) -> Any:
        """`<arch>.<name>` checked to be a `kind` (the family's default, else `default`, when absent;
        MetadataError when required and absent). Marks the key used."""
        return self._meta.get(name, kind, default)

    def value(self, name: str) -> Any:
        """`<arch>.<name>` as stored (a number or a numpy array; None when absent), for keys gguf-py
        does not spell yet or whose type varies (a period or a per-layer array). Marks it used."""
        key = f"{self.arch}.{name}"
        value = self._meta.gguf.metadata.get(key)
        if value is not None:
            self._meta.used.add(key)
        return value

    def period(self, name: str, value: Any) -> int:
        """`value` (read from key `<arch>.<name>`) as a layer period, 1 to the compiler's layer limit;
        MetadataError otherwise."""
        key = f"{self.arch}.{name}"
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise MetadataError(f"metadata key {key!r} has type {type(value).__name__}, expected int")
        if not 1 <= value <= self._max_layers:
            raise MetadataError(f"metadata key {key!r} = {value} is outside [1, {self._max_layers}]")
        return int(value)

    def layers(self, prop: str) -> tuple[bool, ...]:
        """The flags of a property decided before this one (PROPERTIES order)."""
        if prop not in self._decided:
            raise KeyError(f"{prop!r} is not decided before the property being asked (order: {PROPERTIES})")
        return self._decided[prop]


def layer_patterns(plugins: Any = None) -> Mapping[str, LayerPattern]:
    """name -> LayerPattern, as the plugins register them (None: the installed plugins)."""
    from archrun.plugins import checked_plugin_manager
    from archrun.plugins.registry import collect_named

    return collect_named(checked_plugin_manager(plugins), "archrun_register_layer_patterns", "layer pattern",
                         LayerPattern)


def decide(facts: LayerFacts, patterns: Mapping[str, LayerPattern]) -> dict[str, tuple[bool, ...]]:
    """property -> a flag per layer, every property of PROPERTIES decided in order."""
    if not patterns:
        raise UnknownVocabulary("no installed plugin registers layer patterns (which layers are recurrent, "
                                "sliding or without rope): install the vocabulary package")
    for prop in PROPERTIES:
        ranked = sorted((p for p in patterns.items() if p[1].property == prop), key=lambda p: (-p[1].rank, p[0]))
        flags = next((answer for name, pattern in ranked
                      if (answer := _flags(name, pattern.rule(facts), facts.n_layer)) is not None), None)
        facts._decided[prop] = flags if flags is not None else (False,) * facts.n_layer
    return dict(facts._decided)


def _flags(name: str, answer: Any, n: int) -> tuple[bool, ...] | None:
    if answer is None:
        return None
    if isinstance(answer, str | bytes | Mapping) or not isinstance(answer, Sequence | np.ndarray) or len(answer) != n:
        raise PluginError(f"layer pattern {name!r} answered {type(answer).__name__} "
                          f"{'of length ' + str(len(answer)) if hasattr(answer, '__len__') else ''}, "
                          f"not a flag per layer ({n})")
    return tuple(bool(x) for x in answer)
