"""Cold start: seconds to the first answer token of `archrun run` on an empty kernel cache, and warm.

    .venv/bin/python bench/bench_coldstart.py [MODEL] [--tokens N] [--untiered]

Each run is a fresh process with its own empty NUMBA_CACHE_DIR. Printed per run: seconds until the
first byte of the streamed answer, total seconds, peak RSS of the `archrun` process. Runs:
- cold (tiered, the default): the reference backend answers while the kernels compile in a
  background process (archrun.run.tiered);
- full speed: when that background compile has finished (its stamp appears), then a warm run on
  the same cache (the fast backend at once);
- with --untiered, also cold with `--backend fast` (the first token waits for every kernel).
The CPU flags are printed beside the numbers (kernels dispatch on them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe  # bench/ is the script's folder

DEFAULT_MODEL = Path.home() / ".cache/archrun/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "What is the capital of France? Answer in one sentence."


def run(model: Path, cache: str, tokens: int, extra: list[str]) -> dict[str, float]:
    """One `archrun run` process: seconds to the first answer byte, total seconds, peak RSS (MB)."""
    exe = Path(sys.executable).with_name("archrun")
    cmd = [str(exe), "run", str(model), "--chat", "-p", PROMPT, "-n", str(tokens), "--temp", "0", *extra]
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    text = first + proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this process's own peak RSS (KiB on Linux)
    total = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"archrun run failed ({status})")
    answer = text.decode(errors="replace").strip()
    return {"first": t_first, "total": total, "rss": usage.ru_maxrss / 1024, "text": answer}


def wait_for_stamp(model: Path, cache: str, timeout: float = 3600.0) -> float:
    """Seconds until the cold run's background warm-up leaves its stamp in `cache`."""
    code = "import sys; from archrun.run import tiered; print(tiered._stamp(sys.argv[1]))"
    stamp = Path(subprocess.run([sys.executable, "-c", code, str(model)], check=True, capture_output=True, text=True,
                                env=dict(os.environ, NUMBA_CACHE_DIR=cache)).stdout.strip())
    t0 = time.perf_counter()
    while not stamp.exists():
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"no warm-up stamp after {timeout:.0f} s")
        time.sleep(1.0)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--untiered", action="store_true", help="also time a cold --backend fast run")
    args = ap.parse_args()
    print(f"model {args.model.name}; {describe()}")
    with tempfile.TemporaryDirectory() as cache:
        cold = run(args.model, cache, args.tokens, [])
        print(f"cold, tiered   : first token {cold['first']:6.1f} s, total {cold['total']:6.1f} s, "
              f"peak RSS {cold['rss']:5.0f} MB  | {cold['text'][:60]!r}")
        waited = wait_for_stamp(args.model, cache)
        print(f"the background compile finished {cold['total'] + waited:6.1f} s after the cold start")
        warm = run(args.model, cache, args.tokens, [])
        print(f"warm           : first token {warm['first']:6.1f} s, total {warm['total']:6.1f} s, "
              f"peak RSS {warm['rss']:5.0f} MB")
    if args.untiered:
        with tempfile.TemporaryDirectory() as cache:
            slow = run(args.model, cache, args.tokens, ["--backend", "fast"])
            print(f"cold, untiered : first token {slow['first']:6.1f} s, total {slow['total']:6.1f} s, "
                  f"peak RSS {slow['rss']:5.0f} MB")


if __name__ == "__main__":
    main()
