"""Packages install on their own: every package states its metadata; each family depends on the
vocabulary packages whose ops its hints name; archrun depends on its built-in vocabulary; and archrun
with one family, installed offline into a fresh venv from their declared requirements alone, runs a
file."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
from support.venvs import linked_venv, pip_install

import archrun

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = [ROOT / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml")),
              *sorted(ROOT.glob("families/*/pyproject.toml"))]
FIXTURE = ROOT / "families/archrun-llama/tests/goldens/llama_gqa.gguf"


def project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def local_packages() -> dict[str, Path]:
    """Distribution name -> its folder, for every package of this repository."""
    return {project(p)["name"]: p.parent for p in PYPROJECTS}


def requirement_name(req: str) -> str:
    return req.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].split("~")[0].strip()


def closure(name: str, packages: dict[str, Path]) -> set[str]:
    """`name` and every package of this repository it requires, transitively (from the pyprojects)."""
    seen, todo = set(), [name]
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        reqs = project(packages[dist] / "pyproject.toml").get("dependencies", [])
        todo += [n for n in map(requirement_name, reqs) if n in packages]
    return seen


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: p.parent.name if p.parent != ROOT else "archrun")
def test_every_package_states_its_metadata(path):
    meta = project(path)
    for field in ("name", "version", "description", "readme", "license", "classifiers", "requires-python"):
        assert meta.get(field), f"{path.relative_to(ROOT)}: no {field}"
    readme = meta["readme"]
    assert (path.parent / readme).is_file() if isinstance(readme, str) else readme.get("text"), readme


def test_archrun_brings_its_built_in_vocabulary():
    assert "archrun-blocks" in map(requirement_name, project(ROOT / "pyproject.toml")["dependencies"])


def test_every_family_depends_on_the_vocabulary_its_hints_name():
    """For each family package: the plugin registering each op its hints name (slot by slot) belongs to
    a distribution the family requires (or is the family itself)."""
    from importlib.metadata import entry_points

    from archrun.family import CONVENTIONS
    from archrun.plugins import default_plugin_manager
    from archrun.vocab import build_vocabulary

    pm = default_plugin_manager()
    providers = {(e.op.slot, e.op.name): e.plugin for e in build_vocabulary(pm)}
    dist_of = {ep.name: ep.dist.name for ep in entry_points(group="archrun")}
    packages = local_packages()
    missing = {}
    for path in sorted(ROOT.glob("families/*/pyproject.toml")):
        meta = project(path)
        required = set(map(requirement_name, meta.get("dependencies", []))) | {meta["name"]}
        for entry in meta.get("entry-points", {}).get("archrun", {}):
            plugin = pm.get_plugin(entry)
            assert plugin is not None, f"{meta['name']}'s entry point {entry!r} is not installed"
            archs = [a for impl in pm.hook.archrun_families.get_hookimpls() if impl.plugin is plugin
                     for a in impl.function()]
            for arch in archs:
                hints = pm.hook.archrun_describe_family(architecture=arch)
                for field, (_, slot) in CONVENTIONS.items():
                    name = getattr(hints, field, None)
                    provider = providers.get((slot, name)) if slot and name else None
                    dist = dist_of.get(provider)
                    if dist in packages and dist not in required:
                        missing.setdefault(meta["name"], set()).add(f"{dist} ({slot}={name!r} of {arch})")
    assert not missing, f"families missing a vocabulary dependency: {missing}"


RUN = """
import json, sys
import archrun
from archrun.plugins import installed_plugins
model = archrun.load(sys.argv[1], backend="reference")
ids = model.tokenizer.encode("Hello there, little model.")
logits = model.forward_step(ids, model.init_cache(32))
print(json.dumps({"plugins": sorted(installed_plugins()), "ids": ids, "logits": logits[:16].tolist(),
                  "where": archrun.__file__}))
"""


def test_archrun_and_one_family_install_on_their_own_and_run(tmp_path):
    """archrun-llama's requirements, resolved by pip from this repository's folders alone (no index),
    bring archrun and its built-in vocabulary; that venv loads and runs a llama file like this one."""
    packages = local_packages()
    needed = closure("archrun-llama", packages)
    assert needed == {"archrun", "archrun-blocks", "archrun-llama"}
    python = linked_venv(tmp_path / "venv")
    pip_install(python, *[a for dist in sorted(needed) for a in ("-e", str(packages[dist]))])
    proc = subprocess.run([python, "-c", RUN, str(FIXTURE)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "NUMBA_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["plugins"] == ["blocks", "llama"]
    model = archrun.load(FIXTURE, backend="reference")
    ids = model.tokenizer.encode("Hello there, little model.")
    assert got["ids"] == ids
    want = model.forward_step(ids, model.init_cache(32))[:16]
    np.testing.assert_allclose(np.asarray(got["logits"], dtype=np.float32), want, rtol=0, atol=0)
