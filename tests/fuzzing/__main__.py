"""Command line of the fuzzing harness (see the package docstring and docs/testing.md).

    .venv/bin/python tests/fuzzing --cases 20000 --seed 1 [--timeout 30] [--memory 1024] [--nice 19]
    .venv/bin/python tests/fuzzing --replay findings/seed1-case17.json
    .venv/bin/python tests/fuzzing --seed 1 --case 17          # the same case, drawn again from its seed
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tests/fuzzing", description="fuzz archrun with hostile inputs")
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per case before it counts as a hang")
    p.add_argument("--memory", type=int, default=1024, help="MiB of address space the worker may add")
    p.add_argument("--nice", type=int, default=0, help="niceness of the worker")
    p.add_argument("--findings", type=Path, default=Path("fuzz-findings"), help="folder for failing cases")
    p.add_argument("--report", type=Path, default=None, help="write the summary JSON here")
    p.add_argument("--replay", type=Path, default=None, help="run one saved case in this process")
    p.add_argument("--case", type=int, default=None, help="run case CASE of --seed in this process")
    args = p.parse_args(argv)
    if args.replay or args.case is not None:
        from fuzzing.runner import case_at
        from fuzzing.worker import run_case

        case = case_at(args.seed, args.case) if args.case is not None else json.loads(args.replay.read_text())
        case = case.get("case", case)
        print(json.dumps(case))
        print(json.dumps(run_case(case), indent=1))
        return 0
    from fuzzing.runner import Runner, fuzz

    last = [0.0]

    def progress(done: int, total: int, status) -> None:
        if time.monotonic() - last[0] > 30 or done == total:
            last[0] = time.monotonic()
            print(f"{done}/{total} {dict(status)}", flush=True)

    runner = Runner(timeout=args.timeout, memory=args.memory, nice=args.nice)
    try:
        summary = fuzz(args.cases, args.seed, runner, args.findings, progress)
    finally:
        runner.close()
    summary.pop("examples")
    text = json.dumps(summary, indent=1)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    return 1 if summary["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
