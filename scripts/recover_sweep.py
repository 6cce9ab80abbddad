"""Try the Level 2 recovery loop on the families' tiny HF fixtures, each renamed to an unknown
architecture: the hit rate and search time per fixture (docs/level2.md's table).

    python scripts/recover_sweep.py [--budget S] [--backend reference|fast] [--first] [FIXTURE_GLOB...]

Needs torch and transformers (the `reference` extra). Prints one line per fixture and a summary;
``--first`` tries only each family folder's first fixture.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from archrun.conformance import hf
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.hf_trace import trace_hf
from archrun.conformance.recover import recover
from archrun.errors import ArchrunError

ROOT = Path(__file__).resolve().parents[1]


def fixtures(first: bool, globs: list[str]):
    for spec_path in sorted(ROOT.glob("families/*/tests/**/hf_arch.py")):
        folder = spec_path.parent
        spec = hf.load_module(spec_path)
        for k, fx in enumerate(spec.FIXTURES):
            gguf = folder / "goldens" / f"{fx.name}.gguf"
            if not gguf.is_file() or (first and k) or (globs and not any(fnmatch.fnmatch(fx.name, g) for g in globs)):
                continue
            yield spec, fx, gguf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--first", action="store_true")
    ap.add_argument("globs", nargs="*")
    args = ap.parse_args(argv)
    tried = hit = 0
    total = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for spec, fx, gguf in fixtures(args.first, args.globs):
            tried += 1
            try:
                model, _ = hf.build_tiny(hf.arch_of(spec.ARCHES, fx), fx.seed, **fx.overrides)
                ids = hf.load_golden(gguf.with_suffix(".npz"))["ids"].astype(np.int64)
                ref = trace_hf(model, ids, fx.name)
                path = rewrite_gguf(gguf, Path(tmp) / f"{fx.name}.gguf", architecture="mystery")
            except Exception as e:  # noqa: BLE001 - a fixture the tracer cannot take is reported, not fatal
                print(f"{fx.name:40s} SKIP  {type(e).__name__}: {str(e)[:150]}", flush=True)
                tried -= 1
                continue
            t0 = time.monotonic()
            try:
                found = recover(path, ref, backend=args.backend, budget=args.budget)
            except ArchrunError as e:
                print(f"{fx.name:40s} FAIL  {time.monotonic() - t0:6.1f} s  {str(e)[:400]}", flush=True)
                continue
            hit += 1
            changes = "; ".join(", ".join(f"{k}={v}" for k, v in s.changes.items()) for s in found.steps)
            print(f"{fx.name:40s} OK    {found.seconds:6.1f} s  {found.evaluations:4d} runs  {changes}", flush=True)
    print(f"recovered {hit}/{tried} in {time.monotonic() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
