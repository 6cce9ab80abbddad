"""examples/: the out-of-tree vocabulary plugin in a venv of its own, the scripts, and the core's ignorance of both.

- A fresh venv (python -m venv) gets only the core, archrun-blocks and examples/archrun-example-vocab
  (editable, so numba's kernel caches are the ones the main venv fills; versions pinned to the
  running venv's, so pip installs from its cache and numba's caches stay valid), and the example
  package's own tests pass there, archrun's conformance kit (enabled by its conftest.py) and the
  kit's mutation test included; then the family template is installed and passes the kit.
- examples/generate.py, chat.py and mtp_draft_verify.py run on tiny fixtures.
- No file of the core names the example package, its op or its architecture.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import archrun

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
VOCAB = "examples/archrun-example-vocab"
TEMPLATE = "examples/family-template"
# what only the example package says: its distribution/module/entry-point names, its op, its architecture
EXAMPLE_NAMES = ("archrun-example-vocab", "archrun_example_vocab", "example_vocab", "gelu_quick", "quickgelu")


def _fixture(family: str, name: str) -> Path:
    """A tiny HF fixture: in its family's tests/goldens (or the older tests/goldens/tiny)."""
    for path in (ROOT / "families" / f"archrun-{family}" / "tests" / "goldens" / f"{name}.gguf",
                 ROOT / "tests" / "goldens" / "tiny" / f"{name}.gguf"):
        if path.exists():
            return path
    pytest.fail(f"tiny fixture {name}.gguf not found")


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without what would leak the main venv into a child."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ARCHRUN_PLUGINS", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return env | {"PYTHONIOENCODING": "utf-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1"} | extra


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=timeout, **kw)


def _ok(proc: subprocess.CompletedProcess, what: str) -> str:
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out[-4000:]}\n{proc.stderr.decode()[-4000:]}"
    return out


# -- (a) the example plugin in a venv of its own ------------------------------------------------------


@pytest.fixture
def fresh_venv(tmp_path):
    """A new venv with pip (removed afterwards: it holds numba, llvmlite, numpy, ...)."""
    env_dir = tmp_path / "venv"
    try:
        venv.EnvBuilder(with_pip=True).create(env_dir)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot create a venv with pip here (python -m venv): {e}")
    yield env_dir
    shutil.rmtree(env_dir, ignore_errors=True)


def test_example_vocab_plugin_in_a_fresh_venv(fresh_venv, tmp_path):
    env_dir = fresh_venv
    py = str(env_dir / "bin" / "python")
    # pin every dependency to this venv's version: pip installs from its cache, and numba (whose
    # version is part of the kernel caches' stamp) is the one that filled the shared caches
    constraints = tmp_path / "constraints.txt"
    frozen = _ok(_run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], 120, env=_env()), "pip freeze")
    constraints.write_text("".join(f"{line}\n" for line in frozen.splitlines() if "==" in line))
    env = _env(VIRTUAL_ENV=str(env_dir))
    _ok(_run([py, "-m", "pip", "install", "-q", "-c", str(constraints), "-e", ".", "-e", "plugins/archrun-blocks",
              "-e", f"{VOCAB}[test]"], 600, env=env), "pip install (core, archrun-blocks, example vocab)")

    listed = _ok(_run([py, "-c", "from archrun.plugins import installed_plugins; print(sorted(installed_plugins()))"],
                      120, env=env), "listing plugins")
    assert listed.strip() == "['blocks', 'example_vocab']"  # no family of this repository: only the example's
    # the package's own tests, archrun's conformance kit (pytest11 plugin of the core, enabled by the
    # package's conftest.py) and the kit's mutation test
    out = _ok(_run([py, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"{VOCAB}/tests"], 900, env=env),
              "the example package's tests")
    # only the fast backend's logit-bit hashes may skip: when this process compiled a kernel (a cold cache)
    skipped = [line for line in out.splitlines() if "SKIPPED" in line and "TestArchrunBitHashes" not in line]
    assert " passed" in out and not skipped and "FAILED" not in out, skipped
    _assert_kit_ran(out, f"{VOCAB}/tests", ("test_matches_reference", "test_fast_op_equals_reference",
                                            "test_bad_input", "test_fused_decode_equals_op_by_op",
                                            "test_greedy_chain"))
    # the reference backend's hashes run wherever the example recorded this machine class (the kit skips them
    # elsewhere, naming the nearest recorded class)
    recorded = _ok(_run([py, "-c", "from pathlib import Path; from archrun.conformance import bithash; "
                         f"print(bithash.record_for(Path('{VOCAB}/tests'), bithash.machine_class())[0] is not None)"],
                        120, env=env), "the example's hash record for this machine class").strip()
    hashes = "PASSED" if recorded == "True" else "SKIPPED"
    assert re.search(rf"TestArchrunBitHashes::test_logit_bits\[synthetic-quickgelu_moe-reference\] {hashes}", out)
    assert out.count("test_a_flipped_convention_fails_the_reference_check_naming_the_op[") == 5
    assert "test_the_unmutated_package_passes_the_kit PASSED" in out

    _ok(_run([py, "-m", "pip", "install", "-q", "-c", str(constraints), "-e", TEMPLATE], 300, env=env),
        "pip install (family template)")
    out = _ok(_run([py, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"{TEMPLATE}/tests"], 300, env=env),
              "the family template's test")
    assert "FAILED" not in out and "SKIPPED" not in out
    _assert_kit_ran(out, f"{TEMPLATE}/tests", ("test_registers", "test_cache_paths_agree", "test_bad_input"))


def _assert_kit_ran(out: str, tests: str, names: tuple[str, ...]) -> None:
    """The kit's generated tests ran (pytest -v lines "<tests>/conftest.py::TestArchrunConformance::<name>...")."""
    ran = [line for line in out.splitlines() if f"{tests}/conftest.py::TestArchrunConformance::" in line]
    assert ran, f"no test of archrun's conformance kit ran in {tests}"
    for name in names:
        assert any(f"::{name}" in line and "PASSED" in line for line in ran), f"the kit's {name} did not run"


# -- (b) the scripts -------------------------------------------------------------------------------------


def test_generate_script_streams_the_greedy_completion():
    path, prompt = _fixture("llama", "llama_gqa"), "Hello world"
    proc = _run([sys.executable, "examples/generate.py", str(path), "-p", prompt, "-n", "8", "--temp", "0"], 600,
                env=_env())
    out = _ok(proc, "examples/generate.py")
    want = archrun.generate(archrun.load(path), prompt, max_tokens=8, temperature=0).complete()
    assert out == prompt + want.text + "\n"
    assert f"[{want.completion_tokens} tokens, finish: {want.finish_reason}" in proc.stderr.decode()


def test_chat_script_answers_one_turn():
    # gemma3 files carry no chat template: the family's default renders the turn
    proc = _run([sys.executable, "examples/chat.py", str(_fixture("gemma3", "gemma3_period6_tied")), "-m", "Hi there",
                 "-n", "6", "--temp", "0"], 600, env=_env())
    _ok(proc, "examples/chat.py")
    assert "generated, finish:" in proc.stderr.decode()


def test_mtp_script_reproduces_plain_greedy_decoding():
    proc = _run([sys.executable, "examples/mtp_draft_verify.py", str(_fixture("glm4moe", "glm4moe_base")), "-n", "10",
                 "-k", "2"], 600, env=_env())
    out = _ok(proc, "examples/mtp_draft_verify.py")
    rounds = [line for line in out.splitlines() if line.startswith("round ")]
    assert rounds and all("drafted" in line and "accepted" in line for line in rounds)
    spec = next(line for line in out.splitlines() if line.startswith("speculative:"))
    plain = next(line for line in out.splitlines() if line.startswith("greedy:"))
    assert spec.split(":", 1)[1].strip() == plain.split(":", 1)[1].strip()
    assert out.rstrip().endswith("speculative decoding equals plain greedy decoding")


# -- (c) the core knows no example ------------------------------------------------------------------------


def test_core_names_no_example():
    core = ROOT / "core"
    assert Path(archrun.__file__).resolve().parent.parent == core
    offenders = []
    for f in core.rglob("*"):
        if not f.is_file() or any(p == "__pycache__" or p.endswith(".egg-info") for p in f.relative_to(core).parts):
            continue
        text = f.read_bytes().decode("utf-8", "ignore").lower()
        offenders += [f"{f.relative_to(ROOT)}: {n}" for n in EXAMPLE_NAMES if n in text]
    assert not offenders, offenders
    assert (EXAMPLES / "archrun-example-vocab" / "pyproject.toml").exists()  # the names above are real
