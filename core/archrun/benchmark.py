"""`archrun bench`: prefill and decode speed, load-to-first-token time and peak RSS of one model."""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import numpy as np


def run_bench(path: str | os.PathLike, threads: int | None = None, backend: str | None = None,
              block_style: str | None = None, prompt_tokens: int = 128, gen_tokens: int = 64,
              seed: int = 0, kv_type: str = "f32", repetitions: int = 3) -> dict[str, Any]:
    """Measure one model; token ids are random (seeded) so no tokenizer work is timed. kv_type: the cache's
    K/V row format (f32, f16, q8_0).

    As llama.cpp's llama-bench: one untimed run (prefill, then the decode steps) first, then
    `repetitions` timed runs on a cleared cache; the rates are the median run's, with every run's
    rate listed (`prefill_runs`, `decode_runs`)."""
    from archrun.api import load
    from archrun.errors import ContextOverflow, InvalidRequest
    from archrun.run.cache import kv_options

    kv = kv_options(kv_type)
    for name, n in (("prompt_tokens", prompt_tokens), ("gen_tokens", gen_tokens), ("repetitions", repetitions)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidRequest(f"{name} must be a positive integer, got {n!r}")
    t0 = time.perf_counter()
    model = load(path, block_style=block_style, backend=backend, threads=threads)
    if prompt_tokens + gen_tokens > model.descriptor.n_ctx:
        raise ContextOverflow(f"{prompt_tokens} prompt + {gen_tokens} generated tokens exceed the model's context "
                              f"of {model.descriptor.n_ctx}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.descriptor.n_vocab, size=prompt_tokens)
    cache = model.init_cache(min(model.descriptor.n_ctx, prompt_tokens + gen_tokens + 1), **kv)
    model.forward_step(ids[:1], cache)          # first token after load (includes warm-up)
    first_token_s = time.perf_counter() - t0
    prefill_runs, decode_runs = [], []
    for run in range(repetitions + 1):  # run 0: the untimed warm-up
        cache.clear()
        t1 = time.perf_counter()
        logits = model.forward_step(ids, cache)
        prefill_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        for _ in range(gen_tokens):
            logits = model.forward_step([int(np.argmax(logits))], cache)
        decode_s = time.perf_counter() - t2
        if run:
            prefill_runs.append(prompt_tokens / prefill_s)
            decode_runs.append(gen_tokens / decode_s)
    return {
        "model": str(path),
        "backend": backend or "fast",
        "threads": threads,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "kv_type": kv_type,
        "repetitions": repetitions,
        "prefill_tok_s": float(np.median(prefill_runs)),
        "decode_tok_s": float(np.median(decode_runs)),
        "prefill_runs": prefill_runs,
        "decode_runs": decode_runs,
        "load_to_first_token_s": first_token_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "file_mb": os.path.getsize(path) / 2**20,
    }


def render_bench(r: dict[str, Any]) -> str:
    """A small table of run_bench's result."""
    rows = [
        ("model", os.path.basename(r["model"])),
        ("backend", r["backend"]),
        ("kv cache", r.get("kv_type", "f32")),
        (f"prefill ({r['prompt_tokens']} tok)", f"{r['prefill_tok_s']:.1f} tok/s{_runs(r, 'prefill_runs')}"),
        (f"decode ({r['gen_tokens']} tok)", f"{r['decode_tok_s']:.1f} tok/s{_runs(r, 'decode_runs')}"),
        ("load to first token", f"{r['load_to_first_token_s']:.2f} s"),
        ("peak RSS", f"{r['peak_rss_mb']:.0f} MB (file {r['file_mb']:.0f} MB)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:{width}s}  {v}" for k, v in rows)


def _runs(r: dict[str, Any], key: str) -> str:
    runs = r.get(key) or []
    return f"  (median of {len(runs)}: {', '.join(f'{v:.1f}' for v in runs)})" if len(runs) > 1 else ""
