"""archrun's conformance kit as a pytest plugin (entry point ``pytest11``: ``archrun``).

Installed with archrun, so every pytest run sees it; it does nothing until a package's tests
declare themselves in a ``conftest.py`` with one line::

    archrun_conformance = "myplugin"          # the package's archrun entry-point name

(or a ``archrun.conformance.Conformance`` with synthetic variants and an independent reference).
The plugin then collects, under that ``conftest.py``, the class ``TestArchrunConformance``
(``archrun.conformance.kit.ConformanceKit``: registration, descriptor JSON round trip and
``archrun inspect``, cached prefill = token by token = no cache, rewind and re-decode, batch =
single, fused = op by op, backends, block-style guards, every fast op = its reference, the
corruptions of ``synthetic.corruptions``, the independent reference); for each ``hf_arch.py`` with a
``goldens/`` folder beside it (in the folder or below), ``TestArchrunTinyHf``
(``archrun.conformance.tiny_hf``: the recorded HF goldens, llama.cpp's agreement, the fixtures'
sensitivity, ``-m live``); and, once the package has recorded them, ``TestArchrunBitHashes``
(``archrun.conformance.bithash``: the logit bits recorded for this machine class in
``logit_hashes/``, skipped on other classes).

``pytest --archrun-conformance=off`` disables the generated tests.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

DECLARATION = "archrun_conformance"
# what the kit's tests tolerate whatever the package's own warning filters say: numba calls the fused
# path's kernel parts as first-class functions (experimental), gguf-py's deprecations
#: the kit's tests that run a synthetic model
_MODEL_TESTS = ("test_descriptor_json_round_trip", "test_inspect", "test_cache_paths_agree", "test_rewind_and_redecode",
                "test_backends_agree", "test_batch_equals_single", "test_fused_decode_equals_op_by_op",
                "test_block_style_guards", "test_bad_input", "test_matches_reference", "test_greedy_chain")
_MARKS = [pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaExperimentalFeatureWarning"),
          pytest.mark.filterwarnings("ignore::DeprecationWarning:gguf.*")]


def pytest_addoption(parser) -> None:
    group = parser.getgroup("archrun")
    group.addoption("--archrun-conformance", choices=("on", "off"), default="on",
                    help="collect the archrun conformance kit where a conftest.py declares archrun_conformance")


def pytest_sessionstart(session) -> None:
    kit = sys.modules.get("archrun.conformance.kit")
    if kit is not None:  # files and models of an earlier session in this process (pytest run in-process)
        kit.ConformanceKit._files.clear()
        kit.ConformanceKit._models.clear()


def pytest_collect_file(file_path: Path, parent):
    if file_path.name != "conftest.py" or parent.config.getoption("archrun_conformance") == "off":
        return None
    conftest = parent.config.pluginmanager.get_plugin(str(file_path))
    if conftest is None or not hasattr(conftest, DECLARATION):
        return None
    return KitModule.from_parent(parent, path=file_path)


class KitModule(pytest.Module):
    """The generated test module of one declaring ``conftest.py``."""

    def _getobj(self):
        from archrun.conformance.kit import BitHashes, Conformance, ConformanceKit, hashed_models, own_ops, variants

        conftest = self.config.pluginmanager.get_plugin(str(self.path))
        decl = Conformance.of(getattr(conftest, DECLARATION))
        here = self.path.parent
        module = types.ModuleType(f"archrun_conformance_{abs(hash(str(here)))}")
        module.__file__ = str(self.path)
        body: dict[str, object] = {"declaration": decl, "here": here, "pytestmark": _MARKS,
                                   "__doc__": f"archrun conformance kit for entry point {decl.entry_point!r}"}
        if decl.reference is None:
            body["test_matches_reference"] = body["test_greedy_chain"] = None
        if not any(e.op.fast is not None for e in own_ops(decl.entry_point)):
            body["test_fast_op_equals_reference"] = None
        if not variants(decl):  # a vocabulary package without models: its ops' checks only
            body.update({name: None for name in _MODEL_TESTS})
        module.TestArchrunConformance = type("TestArchrunConformance", (ConformanceKit,), body)
        _add_tiny_hf(module, decl.entry_point, here)
        if (here / "logit_hashes").is_dir() and hashed_models(decl, here):  # recorded for some machine class
            module.TestArchrunBitHashes = type("TestArchrunBitHashes", (BitHashes,),
                                               {"declaration": decl, "here": here, "pytestmark": _MARKS})
        return module


def _add_tiny_hf(module: types.ModuleType, entry_point: str, here: Path) -> None:
    """``TestArchrunTinyHf`` for ``here/hf_arch.py``; ``TestArchrunTinyHf_<folder>`` for each nested one."""
    from archrun.conformance.tiny_hf import MEMORY_TESTS, TinyHfBattery, stateful_fixtures

    for spec_path in sorted(here.rglob("hf_arch.py")):
        folder = spec_path.parent
        if not (folder / "goldens").is_dir():
            continue
        name = "TestArchrunTinyHf" + ("" if folder == here else "_" + "_".join(folder.relative_to(here).parts))
        body: dict[str, object] = {"entry_point": entry_point, "folder": folder, "pytestmark": _MARKS}
        if not stateful_fixtures(folder):  # the memory battery only where a layer keeps state
            body.update({test: None for test in MEMORY_TESTS})
        setattr(module, name, type(name, (TinyHfBattery,), body))
