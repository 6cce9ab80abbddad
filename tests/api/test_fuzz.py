"""The bounded fuzz run of CI: 600 seeded cases of the harness in tests/fuzzing, zero findings.

Each case runs in a worker process under a time limit and an address-space limit (see
tests/fuzzing/runner.py); a crash, a hang or an exception that is not an archrun.ArchrunError
fails this test and the case is saved under the pytest tmp folder (replay it with
`.venv/bin/python tests/fuzzing --replay FILE`). The long run is documented in docs/testing.md.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("hypothesis")

from fuzzing.runner import BATCH, Runner, case_at, draw_cases, fuzz  # noqa: E402

CI_CASES = 600
CI_SEED = 20261201


def test_cases_are_seeded() -> None:
    """The same seed draws the same cases: a CI failure reproduces from its seed and index."""
    assert json.dumps(draw_cases(40, CI_SEED)) == json.dumps(draw_cases(40, CI_SEED))
    assert json.dumps(draw_cases(40, CI_SEED)) != json.dumps(draw_cases(40, CI_SEED + 1))
    assert case_at(CI_SEED, 517) == draw_cases(BATCH, CI_SEED * 1_000_003 + BATCH)[17]


@pytest.mark.fuzz
def test_the_runner_detects_every_kind_of_finding() -> None:
    """A crash (SIGSEGV), a hang, an untyped exception and an exhausted address space are findings;
    the worker is restarted after each crash or hang and keeps serving."""
    runner = Runner(timeout=5.0, memory=256)
    try:
        got = {what: runner.run({"kind": "selftest", "what": what})
               for what in ("typed", "crash", "untyped", "hang", "memory", "typed")}
    finally:
        runner.close()
    assert got["typed"]["status"] == "typed"
    assert got["crash"] == {"status": "crash", "detail": "worker died: SIGSEGV"}
    assert got["hang"]["status"] == "hang"
    assert [s["type"] for s in got["untyped"]["steps"]] == ["KeyError"]
    assert [s["type"] for s in got["memory"]["steps"]] == ["MemoryError"]
    assert runner.restarts == 3  # the first start, then after the crash and after the hang


@pytest.mark.fuzz
def test_bounded_fuzz_run_has_no_findings(tmp_path) -> None:
    runner = Runner(timeout=60.0, memory=1024)
    try:
        summary = fuzz(CI_CASES, CI_SEED, runner, findings_dir=tmp_path / "findings")
    finally:
        runner.close()
    assert summary["cases"] == CI_CASES
    kinds = summary["by_kind"]
    assert {"gguf", "template", "api", "cli", "special", "cross", "signature"} <= kinds.keys()
    assert sum(kinds["gguf"].values()) > CI_CASES // 5
    assert not summary["findings"], json.dumps({"findings": summary["findings"],
                                                "examples": summary["examples"]}, indent=1)[:6000]
