"""Decode tok/s and memory of a synthetic mixture of experts with its experts streamed from disk.

    PYTHONPATH=core:tests python bench/bench_expert_streaming.py [--threads 1] [--tokens 48] [--cap 0.6]

The model is bench_moe.py's qwen3moe-shaped file (d 1024, 8 layers, 32 experts of width 512, 8 used a token;
expert gate/up Q4_K, down Q6_K: ~260 MB of prepared experts). Each case loads it in a fresh process,
decodes a 16-token prompt and then --tokens greedy-free steps on fixed token ids, and reports decode tok/s,
the process's peak and final RSS and the bytes of expert matrices mapped in after the last step (the cap
holds between steps: this is the cap plus the last step's picks):

- resident: every expert in memory;
- cap: `expert_memory` = --cap times the expert bytes; the store stays in the OS's file cache, so a dropped
  expert pages in at memory speed;
- cap, cold: the same cap, and every dropped expert also leaves the OS's file cache (ExpertPager.
  release_file_cache), so each pick of a dropped expert is read from the disk, as when the experts do not
  fit in the machine's memory at all; with the router's picks read ahead (the default) and without
  (ExpertPager.set_prefetch(False)).

The logits of every case are checked equal to the resident ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CASES = ("resident", "cap", "cold", "cold-no-prefetch")


def _rss() -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024


def run_case(path: str, case: str, cap: int | None, threads: int, tokens: int) -> dict:
    import archrun
    from archrun.kernels.matmul import qmatrix

    m = archrun.load(path, expert_memory=cap)
    experts = sum(x.prepared.nbytes for lp in m.plan.layers
                  for x in (*lp.ffn.weights.gate, *lp.ffn.weights.up, *lp.ffn.weights.down))
    qmatrix.set_threads(threads)
    pager = m.plan.pager
    if case.startswith("cold"):
        pager.release_file_cache()
        pager.set_prefetch(case == "cold")
    ids = np.random.default_rng(1).integers(4, 90, 16 + tokens)
    cache = m.init_cache(len(ids) + 1)
    m.forward_step([int(t) for t in ids[:16]], cache)
    logits = []
    start = time.perf_counter()
    for t in ids[16:]:
        logits.append(m.forward_step([int(t)], cache))
    rate = tokens / (time.perf_counter() - start)
    peak, rss = _rss()
    return {"case": case, "tok_s": rate, "peak_rss": peak, "rss": rss, "expert_bytes": experts, "cap": cap,
            "mapped": pager.resident_bytes() if pager else experts,
            "evictions": pager.evictions if pager else 0,
            "digest": float(np.sum(np.asarray(logits, np.float64) * np.arange(1, len(logits) + 1)[:, None]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--cap", type=float, default=0.6, help="expert_memory as a fraction of the expert bytes")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each case (alternating); the best is shown")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--cap-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.gguf, args.case, args.cap_bytes, args.threads, args.tokens)))
        return
    sys.path.insert(0, str(HERE))
    from bench_moe import write
    from machine import describe

    with tempfile.TemporaryDirectory() as tmp:
        path = str(write(Path(tmp) / "moe.gguf"))
        results: dict[str, list[dict]] = {c: [] for c in CASES}
        for _ in range(args.repeat):
            for case in CASES:  # resident first: its expert bytes give the cap
                cap = [] if case == "resident" else [
                    "--cap-bytes", str(int(args.cap * results["resident"][0]["expert_bytes"]))]
                out = subprocess.run([sys.executable, __file__, "--case", case, "--gguf", path, *cap,
                                      "--threads", str(args.threads), "--tokens", str(args.tokens)],
                                     check=True, capture_output=True, text=True).stdout
                results[case].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{describe()}; {args.threads} thread(s); 16-token prompt, {args.tokens} decode steps; "
          f"cap {args.cap:.0%} of the expert bytes; best of {args.repeat}")
    print("| case | decode tok/s | peak RSS MB | final RSS MB | experts mapped after a step MB | experts dropped | "
          "logits |")
    print("|---|---|---|---|---|---|---|")
    reference = results["resident"][0]["digest"]
    for case in CASES:
        best = max(results[case], key=lambda r: r["tok_s"])
        same = all(r["digest"] == reference for r in results[case])
        print(f"| {case} | {best['tok_s']:.1f} | {best['peak_rss'] / 1e6:.0f} | {best['rss'] / 1e6:.0f} | "
              f"{best['mapped'] / 1e6:.0f} | {best['evictions']} | {'same' if same else 'DIFFER'} |")
    print(f"expert bytes: {results['resident'][0]['expert_bytes'] / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
