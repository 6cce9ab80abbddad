"""Decode speed of every architecture on its tiny fixtures: tokens/s and whether decode runs fused.

    .venv/bin/python bench/bench_families.py [--steps N] [--threads T] [--markdown] [--arch ARCH ...]

For each family package under families/ and each architecture its fixtures cover, the first
fixture of that architecture is loaded on the fast backend, a 4-token prompt is prefilled, and
N single-token steps are timed (after 5 warm steps). Tiny models measure per-token overhead
(Python, kernel calls), not bandwidth: compare architectures with each other, not with real models.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fixtures() -> dict[str, Path]:
    """architecture -> the first fixture file of it (by sorted name) under families/*/tests/goldens."""
    from archrun.describe.compile import describe

    found: dict[str, Path] = {}
    for path in sorted(ROOT.glob("families/*/tests/goldens/*.gguf")) + sorted(
            ROOT.glob("families/*/tests/*/goldens/*.gguf")):
        try:
            arch = describe(path).architecture
        except Exception:  # a fixture of another package's vocabulary not installed here
            continue
        found.setdefault(arch, path)
    return found


def decode_path(model) -> str:
    """fused (one kernel call per layer), op by op, or the host_reference block style (op by op by design)."""
    if model.descriptor.block_style == "host_reference":
        return "host_reference style"
    return "fused" if getattr(model, "fused_blocks", None) is not None else "op by op"


def decode_speed(path: Path, steps: int) -> tuple[float, str]:
    import archrun
    from archrun.run.cache import rewind_to

    model = archrun.load(path, backend="fast")
    room = min(model.descriptor.n_ctx, 64)  # tiny fixtures may have tiny contexts: rewind and go on
    cache = model.init_cache(room)
    logits = model.forward_step([1, 2, 3, 4], cache)
    for _ in range(5):
        logits = model.forward_step([int(logits.argmax())], cache)
    elapsed = 0.0
    for _ in range(steps):
        if len(cache) >= room:  # back to the prompt: as far as the cache can return, then recompute
            kept = rewind_to(cache, 4)
            if kept < 4:
                model.forward_step([1, 2, 3, 4][kept:], cache)
        t0 = time.perf_counter()
        logits = model.forward_step([int(logits.argmax())], cache)
        elapsed += time.perf_counter() - t0
    return steps / elapsed, decode_path(model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--arch", nargs="+", default=None, help="only these architectures (default: every one)")
    args = ap.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    warnings.simplefilter("ignore")
    from machine import describe as describe_machine

    print(f"{describe_machine()}; {args.threads} thread(s); {args.steps} decode steps per fixture")
    from archrun.errors import NotGenerative

    for arch, path in sorted(fixtures().items()):
        if args.arch and arch not in args.arch:
            continue
        try:
            tok_s, how = decode_speed(path, args.steps)
        except NotGenerative:  # an encoder: it embeds, it has no decode step
            continue
        if args.markdown:
            print(f"| {arch} | {path.stem} | {tok_s:.0f} | {how} |", flush=True)
        else:
            print(f"{arch:16s} {path.stem:34s} {tok_s:7.0f} tok/s  {how}", flush=True)


if __name__ == "__main__":
    main()
