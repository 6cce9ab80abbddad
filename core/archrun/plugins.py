"""Plugin manager factory: archrun's hookspecs plus every installed plugin of group "archrun".

No import-time side effects: nothing is loaded until `make_plugin_manager()` is called.
The ARCHRUN_PLUGINS environment variable (comma-separated entry-point names) whitelists
which installed plugins load; tests pass `names=` explicitly instead.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, TypeVar

import pluggy

from archrun import hookspecs

GROUP = "archrun"
T = TypeVar("T")


def installed_plugins() -> dict[str, str]:
    """Entry-point name -> module path of every installed archrun plugin."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def make_plugin_manager(
    names: Iterable[str] | None = None, extra: Iterable[object] = ()
) -> pluggy.PluginManager:
    """Build a plugin manager.

    names: entry-point names to load (None: ARCHRUN_PLUGINS if set, else all installed).
    extra: plugin objects (modules or instances) to register in addition, e.g. from tests.
    """
    from archrun import builtin

    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    pm.register(builtin, name="archrun.builtin")
    wanted = _wanted(names)
    for ep in entry_points(group=GROUP):
        if (wanted is None or ep.name in wanted) and pm.get_plugin(ep.name) is None:
            pm.register(ep.load(), name=ep.name)
    for plugin in extra:
        pm.register(plugin)
    return pm


def _wanted(names: Iterable[str] | None) -> set[str] | None:
    if names is not None:
        return set(names)
    env = os.environ.get("ARCHRUN_PLUGINS", "").strip()
    if not env:
        return None
    return {n.strip() for n in env.split(",") if n.strip()}


_default: pluggy.PluginManager | None = None


def default_plugin_manager() -> pluggy.PluginManager:
    """A process-wide plugin manager built on first use (cached)."""
    global _default
    if _default is None:
        _default = make_plugin_manager()
    return _default


def checked_plugin_manager(plugins: object) -> pluggy.PluginManager:
    """`plugins` when it is a pluggy PluginManager, the default one for None; else InvalidRequest."""
    from archrun.errors import InvalidRequest

    if plugins is None:
        return default_plugin_manager()
    if not isinstance(plugins, pluggy.PluginManager):
        raise InvalidRequest(f"plugins must be a pluggy PluginManager (archrun.plugins.make_plugin_manager), got "
                             f"{type(plugins).__name__}")
    return plugins


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
