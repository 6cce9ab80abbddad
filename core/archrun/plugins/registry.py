"""Collect-all registries built from a plugin manager's hooks, cached per manager and set of plugins.

The vocabulary, pre-tokenizers, tokenizer models and layer patterns are such registries. This module
imports nothing of archrun's at load (the vocabulary, the tokenizer and the layer patterns read it, and
archrun.plugins builds the managers they read)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import pluggy

T = TypeVar("T")

_collected: weakref.WeakKeyDictionary[pluggy.PluginManager, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def collected(pm: pluggy.PluginManager, what: str, build: Callable[[pluggy.PluginManager], T]) -> T:
    """``build(pm)``, computed once per plugin manager and set of registered plugins.

    Collect-all registries (the vocabulary, pre-tokenizers, tokenizer models, layer patterns) are
    built through this: their hooks run once per plugin manager, and again only after a plugin
    was registered or unregistered. ``what`` names the registry.
    """
    plugins = frozenset((name, id(plugin)) for name, plugin in pm.list_name_plugin())
    per_manager = _collected.setdefault(pm, {})
    hit = per_manager.get(what)
    if hit is not None and hit[0] == plugins:
        return hit[1]
    value = build(pm)
    per_manager[what] = (plugins, value)
    return value


def collect_named(pm: pluggy.PluginManager, hook: str, what: str, kind: type | None = None) -> Mapping[str, Any]:
    """A collect-all registry of named entries: every plugin implementing `hook` is called with
    ``register(name, value)``. A name registered twice, a name that is not a non-empty string, or a
    value that is not a `kind`, is a PluginError naming the plugin(s). Built once per plugin manager
    (`collected`); read-only."""

    def build(pm: pluggy.PluginManager) -> Mapping[str, Any]:
        from archrun.errors import PluginError

        table: dict[str, tuple[Any, str]] = {}
        for impl in getattr(pm.hook, hook).get_hookimpls():
            def register(name: str, value: Any, _plugin: str = impl.plugin_name) -> None:
                if not isinstance(name, str) or not name:
                    raise PluginError(f"plugin {_plugin!r} registered a {what} named {name!r}: names are non-empty "
                                      "strings")
                if kind is not None and not isinstance(value, kind):
                    raise PluginError(f"plugin {_plugin!r} registered {what} {name!r} as a {type(value).__name__}, "
                                      f"not a {kind.__module__}.{kind.__qualname__}")
                if name in table:
                    raise PluginError(f"{what} {name!r} is registered by both {table[name][1]!r} and {_plugin!r}")
                table[name] = (value, _plugin)

            impl.function(register=register)
        return MappingProxyType({name: value for name, (value, _) in table.items()})

    return collected(pm, hook, build)
