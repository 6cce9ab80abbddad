"""Batched decode inside one process: forward_step_batch of B one-token rows, and verification spans.

For each model and batch size B it prints aggregate decode tok/s of B sequences stepping together
through `forward_step_batch`, on two paths measured alternately in the same process:

- rows: the fused multi-row kernel (kernels.decode.layer.decode_rows: one kernel call per layer for all
  rows, products through the decode pool, every row bit-identical to its one-token step);
- op-by-op: the multi-row op-by-op path the batch took before (the prefill's products and attention
  per sequence), forced by reporting the rows kernel unavailable.

and the ratio of each to one stream's one-token forward_step. A last line per model times a span of
k tokens (speculative verification) against k one-token steps.

    python bench/bench_batch.py smollm2 qwen25 --threads 2
    python bench/bench_batch.py smollm2 --levels 8 --kv-type q8_0

No HTTP, no scheduling: bench/bench_serve.py measures the server on top of this.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from fetch_models import MODELS, model_path  # noqa: E402
from machine import describe  # noqa: E402

import archrun  # noqa: E402
from archrun.kernels.decode import fusion  # noqa: E402
from archrun.kernels.matmul import qmatrix  # noqa: E402
from archrun.run.cache import kv_options  # noqa: E402

_ROWS_READY = fusion.DecodeSteps.rows_ready


def _op_by_op(on: bool) -> None:
    """Force (or release) the op-by-op batch path."""
    fusion.DecodeSteps.rows_ready = property(lambda self: False) if on else _ROWS_READY


def _caches(model, b: int, prompt_len: int, capacity: int, kv_type: str = "f32") -> list:
    caches = []
    for i in range(b):
        c = model.init_cache(capacity, **kv_options(kv_type))
        model.forward_step([(7 * i + j) % 1000 + 10 for j in range(prompt_len)], c)
        caches.append(c)
    return caches


def _batch_tok_s(model, b: int, steps: int, prompt_len: int, kv_type: str = "f32") -> float:
    caches = _caches(model, b, prompt_len, prompt_len + steps + 2, kv_type)
    ids = [[100 + i] for i in range(b)]
    model.forward_step_batch(ids, caches) if b > 1 else model.forward_step(ids[0], caches[0])  # warm
    t0 = time.perf_counter()
    for _ in range(steps):
        if b > 1:
            model.forward_step_batch(ids, caches)
        else:
            model.forward_step(ids[0], caches[0])
    return b * steps / (time.perf_counter() - t0)


def _span_ms(model, k: int, reps: int) -> tuple[float, float]:
    """(one span of k tokens, k one-token steps) in ms, both from the same cached prefix."""
    span = [100 + j for j in range(k)]
    c = _caches(model, 1, 24, 24 + k * (reps + 1) + 2)[0]
    model.forward_step_batch_spans([span], [c], all_logits=True)
    t0 = time.perf_counter()
    for _ in range(reps):
        model.forward_step_batch_spans([span], [c], all_logits=True)
    t_span = (time.perf_counter() - t0) / reps
    c = _caches(model, 1, 24, 24 + k * (reps + 1) + 2)[0]
    t0 = time.perf_counter()
    for _ in range(reps):
        for t in span:
            model.forward_step([t], c)
    return 1e3 * t_span, 1e3 * (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help=f".gguf paths or names of {', '.join(MODELS)}")
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=24, help="tokens cached per sequence before the steps")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--span", type=int, default=8, help="tokens of the verification span line (0: none)")
    ap.add_argument("--kv-type", choices=("f32", "f16", "q8_0"), default="f32", help="the caches' K/V row format")
    args = ap.parse_args()
    qmatrix.set_threads(args.threads)
    print(f"{describe()}; threads {args.threads}, load {os.getloadavg()[0]:.2f} (1-min average at start)")
    for name in args.models:
        path = model_path(name) if name in MODELS else Path(name)
        model = archrun.load(path)
        levels = [int(x) for x in args.levels.split(",")]
        one = _batch_tok_s(model, 1, args.steps, args.prompt, args.kv_type)
        for b in levels:
            got = {}
            for mode in ("rows", "op-by-op", "rows"):  # alternate: host load drifts
                _op_by_op(mode == "op-by-op")
                got.setdefault(mode, []).append(_batch_tok_s(model, b, args.steps, args.prompt, args.kv_type))
            _op_by_op(False)
            rows, obo = float(np.mean(got["rows"])), float(np.mean(got["op-by-op"]))
            print(f"{path.stem[:28]:28s} {args.kv_type} B={b:2d}  rows {rows:7.1f} tok/s "
                  f"(x{rows / one:.2f} of one stream)  op-by-op {obo:7.1f} tok/s (x{obo / one:.2f})  "
                  f"rows/op-by-op x{rows / obo:.2f}", flush=True)
        if args.span:
            span, steps = _span_ms(model, args.span, 4)
            print(f"{path.stem[:28]:28s} span of {args.span}: {span:.1f} ms, {args.span} one-token steps "
                  f"{steps:.1f} ms (x{steps / span:.2f})", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} (1-min average at the end)")


if __name__ == "__main__":
    main()
