"""Run fuzz cases in a worker process with a time limit; classify and record what happened.

`Runner.run(case)` sends the case to the worker (started on demand, restarted after a crash or
a hang) and returns an outcome: "ok", "typed" (an archrun.ArchrunError), "untyped" (any other
exception, MemoryError included: the worker's address space is limited), "crash" (the worker
died, e.g. by a signal) or "hang" (no answer within the time limit). `fuzz(n, seed)` draws n
cases with hypothesis (seeded: the same seed gives the same cases) and returns the tallies and
the findings; each finding is saved as JSON so `--replay` reproduces it.
"""

from __future__ import annotations

import collections
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("worker.py")
FINDINGS = ("untyped", "crash", "hang", "harness")  # "harness": a case the harness failed to build


class Runner:
    """One worker process at a time; `timeout` seconds per case, `memory` MiB of address space."""

    def __init__(self, timeout: float = 30.0, memory: int = 1024, nice: int = 0, startup: float = 900.0):
        self.timeout, self.memory, self.nice, self.startup = timeout, memory, nice, startup
        self.proc: subprocess.Popen | None = None
        self.tmp = ""
        self.restarts = 0

    def _start(self) -> None:
        # the worker's temporary files live in a folder of ours, removed when it stops (even killed)
        self.tmp = tempfile.mkdtemp(prefix="archrun-fuzz-worker-")
        env = dict(os.environ, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"), PYTHONFAULTHANDLER="",
                   TMPDIR=self.tmp)
        nice = self.nice
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--memory", str(self.memory)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1,
            preexec_fn=(lambda: os.nice(nice)) if nice else None)
        ready = self._read(self.startup)
        if not ready or not ready.get("ready"):
            code = self._stop()
            raise RuntimeError(f"fuzz worker failed to start (exit {code})")

    def _read(self, timeout: float) -> dict | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {}

    def _stop(self) -> int | None:
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return code

    def run(self, case: dict) -> dict:
        """Run one case -> {"status": ..., "steps": [...]} (crash/hang: {"status", "detail"})."""
        if self.proc is None or self.proc.poll() is not None:
            self._stop()
            self._start()
            self.restarts += 1
        assert self.proc is not None and self.proc.stdin is not None
        t0 = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps(case) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        result = self._read(self.timeout)
        elapsed = time.monotonic() - t0
        if result is None:
            self._stop()
            return {"status": "hang", "detail": f"no answer within {self.timeout:g} s"}
        if not result:
            code = self._stop()
            name = signal.Signals(-code).name if code is not None and code < 0 else f"exit {code}"
            return {"status": "crash", "detail": f"worker died: {name}"}
        result["seconds"] = round(elapsed, 3)
        return result

    def close(self) -> None:
        self._stop()


def root_cause(outcome: dict) -> str:
    """A short key grouping findings: status + exception type + innermost archrun frame."""
    if outcome["status"] in ("crash", "hang"):
        return f"{outcome['status']}: {outcome.get('detail', '')}"
    bad = next(s for s in outcome["steps"] if s["status"] == outcome["status"])
    return f"{outcome['status']} {bad['type']} in {bad['step']} at {bad.get('where', '?')}"


def draw_cases(n: int, seed: int) -> list[dict]:
    """n cases drawn by hypothesis from cases.CASES, the same for the same seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from fuzzing.cases import CASES

    drawn: list[dict] = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(CASES)
    def collect(case: dict) -> None:
        drawn.append(case)

    collect()
    return drawn[:n]


BATCH = 500  # cases drawn per hypothesis run


def case_at(seed: int, index: int) -> dict:
    """Case `index` of the run with `seed` (what `fuzz` ran at that index)."""
    start = index // BATCH * BATCH
    return draw_cases(BATCH, seed * 1_000_003 + start)[index - start]


def fuzz(n: int, seed: int, runner: Runner, findings_dir: Path | None = None, progress: Any = None,
         batch: int = BATCH) -> dict:
    """Draw and run n cases; returns tallies by status and kind, and findings by root cause."""
    status = collections.Counter()
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    causes: dict[str, list[dict]] = collections.defaultdict(list)
    done = 0
    t0 = time.monotonic()
    for start in range(0, n, batch):
        cases = draw_cases(min(batch, n - start), seed * 1_000_003 + start)
        for i, case in enumerate(cases):
            outcome = runner.run(case)
            status[outcome["status"]] += 1
            by_kind[case["kind"]][outcome["status"]] += 1
            if outcome["status"] in FINDINGS:
                cause = root_cause(outcome)
                causes[cause].append(case)
                if findings_dir is not None:
                    findings_dir.mkdir(parents=True, exist_ok=True)
                    name = f"seed{seed}-case{start + i}.json"
                    (findings_dir / name).write_text(json.dumps({"case": case, "outcome": outcome, "cause": cause,
                                                                 "seed": seed, "index": start + i}, indent=1))
            done += 1
            if progress is not None:
                progress(done, n, status)
    return {"cases": done, "seed": seed, "seconds": round(time.monotonic() - t0, 1), "status": dict(status),
            "by_kind": {k: dict(v) for k, v in by_kind.items()},
            "findings": {c: len(v) for c, v in sorted(causes.items(), key=lambda kv: -len(kv[1]))},
            "examples": {c: v[0] for c, v in causes.items()}, "restarts": runner.restarts}
