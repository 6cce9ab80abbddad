"""Plugin manager factory: archrun's hookspecs plus every installed plugin of group "archrun".

No import-time side effects: nothing is loaded until `make_plugin_manager()` is called.
The ARCHRUN_PLUGINS environment variable (comma-separated entry-point names) whitelists
which installed plugins load; tests pass `names=` explicitly instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib.metadata import entry_points

import pluggy

from archrun import hookspecs

GROUP = "archrun"


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
    from archrun.plugins import builtin

    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    pm.register(builtin, name="archrun.plugins.builtin")
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


