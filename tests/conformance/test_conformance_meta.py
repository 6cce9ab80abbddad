"""Meta-tests of the conformance kit's reach: every installed op with a fast factory gets the kit's generated
reference-vs-fast test (its package declares the kit, the kit has a harness for its slot, an op with its own
layout has declared specs), and every in-repo family and vocabulary package runs its tests through the kit
without ad-hoc copies of what the kit checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from archrun.conformance import kit, ops
from archrun.errors import InvalidRequest
from archrun.plugins import default_plugin_manager
from archrun.vocab import build_vocabulary

ROOT = Path(__file__).resolve().parents[2]
#: packages being written while the kit landed; they adopt it themselves (then leave this set)
ADOPTING = {"archrun-recurrent"}
#: what the kit generates, so a package's own tests must not repeat it
KIT_ONLY = ("TinyHfBattery", "check_family_plugin(", "check_vocabulary_plugin(",
            # the memory battery (archrun.conformance.memory): rewinds, a chat's prefix reuse, speculative drafts
            "cache.rewind(3)", "PrefixCache(", "speculative.generate(")


def _packages() -> list[Path]:
    return sorted(p for p in [*ROOT.glob("families/*"), *ROOT.glob("plugins/*")] if (p / "pyproject.toml").is_file())


def _declares_kit(package: Path) -> bool:
    conftest = package / "tests" / "conftest.py"
    return conftest.is_file() and "archrun_conformance" in conftest.read_text()


def _package_of(plugin: str) -> str:
    from archrun.conformance import hf

    return hf.package_root(plugin).name


FAST_OPS = [e for e in build_vocabulary(default_plugin_manager()) if e.op.fast is not None]


@pytest.mark.parametrize("entry", FAST_OPS, ids=[f"{e.op.slot}={e.op.name}" for e in FAST_OPS])
def test_every_registered_op_has_a_reference_vs_fast_test_from_the_kit(entry):
    if _package_of(entry.plugin) in ADOPTING:
        pytest.skip(f"{entry.plugin} adopts the kit itself")
    try:
        declared = kit.declarations(entry.plugin)
    except InvalidRequest as e:
        pytest.fail(f"{entry.op.slot}={entry.op.name}: {e}")
    key = f"{entry.op.slot}={entry.op.name}"
    driven = any(key in decl.op_drivers for decl, _ in declared)  # the package's driver runs the cases
    assert driven or entry.op.slot in ops.SLOTS_COVERED, \
        f"the kit has no fast-op harness for slot {entry.op.slot!r}: declare an op driver (Conformance(op_drivers=...))"
    if entry.op.layout is not None:
        assert any(key in decl.op_specs or key in decl.op_drivers for decl, _ in declared), \
            (f"{key} has its own layout: its package must declare Conformance(op_specs={{{key!r}: [...]}}) "
             "or an op driver (Conformance(op_drivers=...))")


@pytest.mark.parametrize("package", _packages(), ids=lambda p: p.name)
def test_every_in_repo_package_runs_its_tests_through_the_kit(package):
    if package.name in ADOPTING:
        assert not _declares_kit(package), f"{package.name} uses the kit now: remove it from ADOPTING"
        pytest.skip(f"{package.name} adopts the kit itself")
    assert _declares_kit(package), f"{package.name}/tests/conftest.py does not declare archrun_conformance"
    own = _own_drafters(package)
    for test in sorted((package / "tests").rglob("test_*.py")):
        text = test.read_text()
        # a package's own drafter runs through the speculative loop in its tests: the kit knows no family's drafter
        drafts_own = any(f'"{name}' in text for name in own)
        found = [k for k in KIT_ONLY if k in text and not (k == "speculative.generate(" and drafts_own)]
        assert not found, f"{test.relative_to(ROOT)} repeats what the kit checks: {found}"


def _own_drafters(package: Path) -> list[str]:
    """The names of the drafters the package's own code registers (`archrun_register_drafters`)."""
    from archrun.generation import speculative

    src = package.resolve()
    names = []
    for name, (factory, _) in speculative.drafters().items():
        module = sys.modules.get(factory.__module__)
        where = Path(getattr(module, "__file__", "") or "").resolve()
        if src in where.parents:
            names.append(name)
    return names
