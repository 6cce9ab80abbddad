"""Registration checks of a plugin package (the kit's first tests; re-exported by archrun.conformance)."""

from __future__ import annotations

from archrun.family import FamilyHints
from archrun.plugins import installed_plugins, make_plugin_manager
from archrun.vocab import Entry, build_vocabulary


def check_family_plugin(name: str) -> list[str]:
    """Assert that entry point `name` is installed and describes each architecture it lists.

    Returns the architectures. Raises AssertionError naming what is wrong.
    """
    assert name in installed_plugins(), f"no archrun entry point named {name!r} is installed"
    pm = make_plugin_manager(names=[name])
    archs = [a for lst in pm.hook.archrun_families() for a in lst]
    assert archs, f"plugin {name!r} lists no architectures (archrun_families)"
    for arch in archs:
        hints = pm.hook.archrun_describe_family(architecture=arch)
        assert isinstance(hints, FamilyHints), f"{name!r} lists {arch!r} but does not describe it"
    assert pm.hook.archrun_describe_family(architecture="\0no-such-architecture") is None
    return archs


def check_vocabulary_plugin(name: str) -> list[Entry]:
    """Assert that entry point `name` is installed and registers vocabulary; returns its entries."""
    assert name in installed_plugins(), f"no archrun entry point named {name!r} is installed"
    entries = [e for e in build_vocabulary(make_plugin_manager(names=[name])) if e.plugin == name]
    assert entries, f"plugin {name!r} registers no vocabulary"
    return entries
