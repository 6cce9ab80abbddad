"""A family plugin package skeleton written from a recovery: the hints found, as a package.

``write_package(recovery, dest, gguf_path, reference)`` writes::

    dest/pyproject.toml                    entry point archrun:<name> -> archrun_<name>:plugin
    dest/archrun_<name>/__init__.py        FamilyHints of the recovered conventions
    dest/tests/conftest.py                 the conformance kit's line
    dest/tests/fixtures/<name>.gguf        the model file (when small: ``MAX_FIXTURE_BYTES``)
    dest/tests/fixtures/<name>.npz         the reference's ids and logits (the fixture's golden)
    dest/tests/test_<name>_reference.py    archrun's logits on the fixture = the reference's, both backends
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from archrun.conformance.recover import Recovery, hint_dict
from archrun.conformance.trace_format import Trace
from archrun.errors import InvalidRequest

MAX_FIXTURE_BYTES = 16_000_000


def _name(architecture: str) -> str:
    return re.sub(r"\W+", "_", architecture.lower()).strip("_") or "family"


def _init_py(recovery: Recovery, module: str) -> str:
    hints = hint_dict(recovery.hints)
    args = "".join(f"\n        {k}={v!r}," for k, v in hints.items())
    steps = "\n".join(f"- {', '.join(f'{k}={v!r}' for k, v in s.changes.items())}: first divergence "
                      f"{s.before} -> {s.after}" for s in recovery.steps) or "- (the first guess matched)"
    return f'''"""archrun family plugin for {recovery.architecture} (descriptions only, no math).

Written by `archrun recover` from a reference trace: these conventions make archrun's logits match
the reference (rel {recovery.report.logits_rel:.3g}; {recovery.evaluations} traced runs, {recovery.seconds:.1f} s).
The changes it made, earliest divergence first:
{steps}
"""

from __future__ import annotations

from archrun.family import FamilyHints, FamilyPlugin

HINTS = {{
    {recovery.architecture!r}: FamilyHints(
        name={recovery.architecture!r},{args}
    ),
}}

plugin = FamilyPlugin(HINTS)
'''


def _pyproject(dist: str, module: str, entry: str, architecture: str) -> str:
    return f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "archrun family plugin: {architecture} (recovered by archrun recover)"
requires-python = ">=3.11"
dependencies = ["archrun", "archrun-blocks"]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.entry-points.archrun]
{entry} = "{module}:plugin"

[tool.setuptools]
packages = ["{module}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''


_CONFTEST = '''"""The family's tests: archrun's conformance kit (docs/conformance.md), enabled by the line below.

No synthetic variants (the recovered conventions may need tensors the kit's writer does not make):
the fixture recorded from the reference carries the model.
"""

from archrun.conformance import Conformance

archrun_conformance = Conformance({entry!r}, synthetic=())
'''

_TEST = '''"""archrun's logits on the fixture recorded by `archrun recover` = the reference's (both backends)."""

from pathlib import Path

import pytest

from archrun.conformance import hf

FIXTURE = Path(__file__).parent / "fixtures" / {gguf!r}


@pytest.mark.parametrize("backend", hf.BACKENDS)
def test_matches_reference(backend):
    if not FIXTURE.is_file():
        pytest.skip(f"{{FIXTURE.name}} was too large to copy: place the model file there")
    hf.check_fixture(FIXTURE, backend, {tolerance!r})
'''


def write_package(recovery: Recovery, dest: str | Path, gguf_path: str | Path, reference: Trace,
                  tolerance: float = 1e-4) -> Path:
    """Write the package (see the module docstring) into ``dest`` (a new or empty folder); return it."""
    dest, gguf_path = Path(dest), Path(gguf_path)
    if dest.exists() and any(dest.iterdir()):
        raise InvalidRequest(f"{dest}: the package folder exists and is not empty")
    entry = _name(recovery.architecture)
    module, dist = f"archrun_{entry}", f"archrun-{entry.replace('_', '-')}"
    (dest / module).mkdir(parents=True, exist_ok=True)
    fixtures = dest / "tests" / "fixtures"
    fixtures.mkdir(parents=True)
    (dest / "pyproject.toml").write_text(_pyproject(dist, module, entry, recovery.architecture))
    (dest / module / "__init__.py").write_text(_init_py(recovery, module))
    (dest / "tests" / "conftest.py").write_text(_CONFTEST.format(entry=entry))
    gguf_name = f"{entry}.gguf"
    (dest / "tests" / f"test_{entry}_reference.py").write_text(_TEST.format(gguf=gguf_name, tolerance=tolerance))
    if gguf_path.stat().st_size <= MAX_FIXTURE_BYTES:
        shutil.copyfile(gguf_path, fixtures / gguf_name)
    meta: dict[str, Any] = {"name": entry, "reference": reference.model, "producer": reference.producer}
    np.savez_compressed(fixtures / f"{entry}.npz", ids=reference.ids.astype(np.int32), logits=reference.logits,
                        config_json=np.array(json.dumps({})), fixture_json=np.array(json.dumps(meta)),
                        versions_json=np.array(json.dumps({})))
    return dest
