"""Benchmark archrun against llama.cpp on the real models, in one run: llama.cpp's own `llama-bench` (the
C++ tool, built once by bench/llamacpp_tools.py) and llama-cpp-python.

Both sides run in their own fresh process (alternating, --repeat times each; medians are
reported), on the same random token ids, at the same thread count: prefill of --prompt-tokens
tokens, then --gen-tokens greedy decode steps; llama-bench runs `-p N -n M -r --repeat` (its own
warm-up, then the mean of the repetitions). Prints a table of tok/s and the archrun/llama.cpp
ratios per CPU class, and writes the same as JSON (--json-out); --no-llama-bench skips the C++ tool.
Decode at a depth: the decode steps run after the prompt, so `--prompt-tokens 4096` measures decode
over 4k cached tokens;
`--depths 512,4096,16384` does that for each depth and prints a decode-at-depth table, with the
KV cache of both sides in --kv-type (f32, f16, q8_0; llama.cpp's type_k/type_v, with flash
attention on where it needs it: a quantized V cache).

    python bench/bench_llamacpp.py --llama-python .venv-bench/bin/python --threads 2
    python bench/bench_llamacpp.py --models smollm2 --depths 512,4096,16384 --kv-type f16 --gen-tokens 32

--llama-python is an interpreter with llama-cpp-python installed (`make bench` makes one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
import llamacpp_tools  # noqa: E402
from fetch_models import MODELS, model_path  # noqa: E402
from machine import describe, machine  # noqa: E402

LLAMA_SNIPPET = r"""
import ctypes, json, resource, sys, time
import numpy as np
import llama_cpp as L
from llama_cpp import Llama
path, (threads, n_prompt, n_gen, seed) = sys.argv[1], map(int, sys.argv[2:6])
kv = {"f32": 0, "f16": 1, "q8_0": 8}[sys.argv[6]]  # ggml type ids
t0 = time.perf_counter()
llm = Llama(model_path=path, n_ctx=n_prompt + n_gen + 8, n_batch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False, seed=seed, type_k=kv, type_v=kv, flash_attn=kv == 8)
ctx, n_vocab = llm.ctx, llm.n_vocab()

def decode(ids):  # llama_decode in batches of n_batch (Llama.eval keeps only n_batch rows of logits)
    for i in range(0, len(ids), 512):
        chunk = (L.llama_token * len(ids[i:i + 512]))(*ids[i:i + 512])
        assert L.llama_decode(ctx, L.llama_batch_get_one(chunk, len(chunk))) == 0
    return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))))

rng = np.random.default_rng(seed)
ids = rng.integers(0, n_vocab, size=n_prompt).tolist()
decode(ids[:1])
first = time.perf_counter() - t0
L.llama_memory_clear(L.llama_get_memory(ctx), True)
t1 = time.perf_counter(); tok = decode(ids); prefill = time.perf_counter() - t1
t2 = time.perf_counter()
for _ in range(n_gen):
    tok = decode([tok])
decode_s = time.perf_counter() - t2
print(json.dumps({"prefill_tok_s": n_prompt / prefill, "decode_tok_s": n_gen / decode_s,
                  "load_to_first_token_s": first,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

ARCHRUN_SNIPPET = r"""
import json, sys
from archrun.benchmark import run_bench
path, (threads, n_prompt, n_gen, seed) = sys.argv[1], map(int, sys.argv[2:6])
print(json.dumps(run_bench(path, threads=threads, prompt_tokens=n_prompt, gen_tokens=n_gen, seed=seed,
                           kv_type=sys.argv[6], repetitions=1)))
"""


def _run(python: str, snippet: str, args: list[str]) -> dict:
    out = subprocess.run([python, "-c", snippet, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", sys.executable))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--models", nargs="*", default=list(MODELS), help=f"names ({', '.join(MODELS)}) or .gguf paths")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per side and model, alternating; each figure is the median (a shared machine is noisy)")
    p.add_argument("--json-out", type=Path, default=HERE / "results" / "latest.json")
    p.add_argument("--depths", default=None, metavar="N,N,...",
                   help="decode at these cached depths (each: a prompt of N tokens, then --gen-tokens steps)")
    p.add_argument("--kv-type", choices=("f32", "f16", "q8_0"), default="f32", help="both sides' KV cache type")
    p.add_argument("--no-llama-bench", action="store_true", help="skip llama.cpp's C++ llama-bench")
    args = p.parse_args()
    llama_bench = None if args.no_llama_bench else llamacpp_tools.build()["llama-bench"]
    depths = [int(d) for d in args.depths.split(",")] if args.depths else [args.prompt_tokens]
    rows = []
    for name in args.models:
        path = str(model_path(name)) if name in MODELS else name
        for depth in depths:
            common = [str(args.threads), str(depth), str(args.gen_tokens), "0", args.kv_type]
            runs = [(_run(sys.executable, ARCHRUN_SNIPPET, [path, *common]),
                     _run(args.llama_python, LLAMA_SNIPPET, [path, *common])) for _ in range(max(1, args.repeat))]
            ours, ref = _median([a for a, _ in runs]), _median([b for _, b in runs])
            rows.append({"model": name, "depth": depth, "kv_type": args.kv_type, "archrun": ours, "llama.cpp": ref,
                         "prefill_ratio": ours["prefill_tok_s"] / ref["prefill_tok_s"],
                         "decode_ratio": ours["decode_tok_s"] / ref["decode_tok_s"]})
            if llama_bench:
                cpp = _llama_bench(llama_bench, path, args.threads, depth, args.gen_tokens, args.repeat, args.kv_type)
                rows[-1] |= {"llama-bench": cpp, "bench_prefill_ratio": ours["prefill_tok_s"] / cpp["prefill_tok_s"],
                             "bench_decode_ratio": ours["decode_tok_s"] / cpp["decode_tok_s"]}
            print(_row(rows[-1]), flush=True)
    report = {"machine": machine(),
              "threads": args.threads, "repeat": args.repeat, "prompt_tokens": args.prompt_tokens,
              "gen_tokens": args.gen_tokens, "kv_type": args.kv_type, "depths": depths,
              "rows": rows}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2))
    print(_depth_table(rows) if args.depths else _table(rows))
    print(f"{describe()}; {args.threads} threads each")
    return 0


def _llama_bench(tool: Path, path: str, threads: int, n_prompt: int, n_gen: int, repeat: int, kv: str) -> dict:
    """llama-bench's prefill and decode tok/s (the means of its repetitions, after its warm-up)."""
    cmd = [str(tool), "-m", path, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-r", str(max(1, repeat)),
           "-o", "json"]
    if kv != "f32":  # llama-bench takes no f32 cache: there it keeps its default, f16
        cmd += ["-ctk", kv, "-ctv", kv] + (["-fa", "1"] if kv == "q8_0" else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"llama-bench failed:\n{out.stderr[-2000:]}")
    tests = json.loads(out.stdout)
    pp = next(t for t in tests if t["n_prompt"] and not t["n_gen"])
    tg = next(t for t in tests if t["n_gen"] and not t["n_prompt"])
    return {"prefill_tok_s": pp["avg_ts"], "prefill_sd": pp["stddev_ts"], "decode_tok_s": tg["avg_ts"],
            "decode_sd": tg["stddev_ts"]}


def _median(results: list[dict]) -> dict:
    """Each numeric field's median over the runs (the other fields from the first run)."""
    out = dict(results[0])
    for key, value in out.items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in results)
    return out


def _row(r: dict) -> str:
    a, b = r["archrun"], r["llama.cpp"]
    line = (f"{r['model']} (depth {r['depth']}, kv {r['kv_type']}): "
            f"prefill {a['prefill_tok_s']:.1f} vs {b['prefill_tok_s']:.1f} tok/s "
            f"({r['prefill_ratio']:.2f}x), decode {a['decode_tok_s']:.1f} vs {b['decode_tok_s']:.1f} tok/s "
            f"({r['decode_ratio']:.2f}x)")
    if "llama-bench" in r:
        c = r["llama-bench"]
        line += (f"; llama-bench prefill {c['prefill_tok_s']:.1f} ({r['bench_prefill_ratio']:.2f}x), "
                 f"decode {c['decode_tok_s']:.1f} ({r['bench_decode_ratio']:.2f}x)")
    return line


def _table(rows: list[dict]) -> str:
    """Prefill and decode tok/s: archrun, llama-bench (C++) and llama-cpp-python, with archrun's ratios."""
    head = ("| model | prefill archrun | llama-bench | ratio | llama-cpp-python | ratio "
            "| decode archrun | llama-bench | ratio | llama-cpp-python | ratio | first token (s) | peak RSS MB |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        a, b = r["archrun"], r["llama.cpp"]
        c = r.get("llama-bench")

        def cpp(key: str, ratio: str, c=c, r=r) -> str:
            return f"{c[key]:.1f} | {r[ratio]:.2f}" if c else "- | -"

        lines.append(
            f"| {r['model']} | {a['prefill_tok_s']:.1f} | {cpp('prefill_tok_s', 'bench_prefill_ratio')} "
            f"| {b['prefill_tok_s']:.1f} | {r['prefill_ratio']:.2f} "
            f"| {a['decode_tok_s']:.1f} | {cpp('decode_tok_s', 'bench_decode_ratio')} "
            f"| {b['decode_tok_s']:.1f} | {r['decode_ratio']:.2f} "
            f"| {a['load_to_first_token_s']:.2f} | {a['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def _depth_table(rows: list[dict]) -> str:
    """Decode tok/s after a prompt of `depth` tokens, both sides, and the ratio (same run)."""
    lines = ["| model | depth | kv type | decode archrun | decode llama.cpp | ratio |", "|" + "---|" * 6]
    for r in rows:
        a, b = r["archrun"], r["llama.cpp"]
        lines.append(f"| {r['model']} | {r['depth']} | {r['kv_type']} | {a['decode_tok_s']:.1f} "
                     f"| {b['decode_tok_s']:.1f} | {r['decode_ratio']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
