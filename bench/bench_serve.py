"""Benchmark `archrun serve` with 1, 4, 8, 16 concurrent streaming clients on loopback.

The server runs in its own process (`archrun serve MODEL --parallel <max level>`); the clients
are asyncio tasks in this process, each streaming a /v1/completions request with its own
prompt and end-of-generation tokens biased away, so every stream generates --max-tokens tokens.
Per level it prints aggregate decode tok/s (tokens after each stream's first, over the span from
the first first-token to the last finish), p50/p95 time-to-first-token and the ratio of the
aggregate to one stream's. A last line measures prefix reuse: the second turn of a conversation
after a long first one (time-to-first-token and prompt tokens computed).

    python bench/bench_serve.py smollm2 --threads 2
    python bench/bench_serve.py qwen25 --levels 1,4,8 --llama-python /work/bench-venv/bin/python

--llama-python: an interpreter with llama-cpp-python and its server extra; llama-cpp-python's
server (llama_cpp.server: one sequence at a time, requests queue behind each other) is then
measured the same way on the same model and thread count.

--batched-bench: llama.cpp's own batched throughput at the same levels, thread count and tokens
per stream (`llama-batched-bench`, built once from the llama.cpp source llama-cpp-python vendors by
bench/llamacpp_tools.py): its S_TG, generated tokens per second of B sequences decoding together
after their prompts (PP 32 tokens each, not shared), is the figure to set beside archrun's
aggregate decode tok/s (which also carries HTTP, SSE and scheduling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from machine import describe, machine  # bench/ is the script's folder

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from fetch_models import MODELS, model_path  # noqa: E402

TOPICS = ["the sea", "a mountain", "bread", "a clock", "winter", "a library", "rain", "trains", "the moon",
          "a garden", "music", "a bridge", "coffee", "a river", "stars", "a forest"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not come up")


async def _stream(client: httpx.AsyncClient, body: dict) -> tuple[float, list[float], float, int]:
    """One streaming completion: (start, each text piece's arrival, end, tokens)."""
    t0 = time.perf_counter()
    n, arrivals = 0, []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    end = time.perf_counter()
    return t0, arrivals or [end], end, n or len(arrivals)  # a server without usage in streams: a piece a token


def _body(i: int, max_tokens: int, no_end: dict) -> dict:
    return {"model": "m", "prompt": f"Write a short story about {TOPICS[i % len(TOPICS)]}.", "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "logit_bias": no_end}


async def _level(url: str, n: int, max_tokens: int, no_end: dict) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        runs = await asyncio.gather(*(_stream(client, _body(i, max_tokens, no_end)) for i in range(n)))
    ttft = sorted(a[0] - s for s, a, _, _ in runs)
    decoded = sum(max(0, k - 1) for *_, k in runs)
    span = max(e for _, _, e, _ in runs) - min(a[0] for _, a, _, _ in runs)
    p95 = ttft[min(len(ttft) - 1, round(0.95 * (len(ttft) - 1)))]
    return {"streams": n, "decode_tok_s": decoded / span if span > 0 else 0.0, "steady_tok_s": _steady(runs),
            "ttft_p50_s": statistics.median(ttft), "ttft_p95_s": p95, "tokens": sum(k for *_, k in runs)}


def _steady(runs: list[tuple[float, list[float], float, int]]) -> float:
    """Tokens per second while all streams decode together: the pieces arriving after the last stream's
    first one and up to the first stream's last one, over that window (what llama-batched-bench's S_TG
    measures: no prompt of another stream inside). One piece a token (the server sends one per token)."""
    start, end = max(a[0] for _, a, _, _ in runs), min(a[-1] for _, a, _, _ in runs)
    if end <= start:
        return 0.0
    return sum(start < t <= end for _, a, _, _ in runs for t in a) / (end - start)


async def _second_turn(url: str, history_words: int) -> dict:
    """TTFT of a conversation's second turn after a first turn of ~history_words words."""
    long_text = " ".join(TOPICS[i % len(TOPICS)].split()[-1] for i in range(history_words))
    turn1 = [{"role": "user", "content": f"Summarise: {long_text}"}]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        r1 = (await client.post("/v1/chat/completions", json={"messages": turn1, "max_tokens": 8,
                                                               "temperature": 0})).json()
        turn2 = [*turn1, r1["choices"][0]["message"], {"role": "user", "content": "Thanks! One more word?"}]
        t0 = time.perf_counter()
        r2 = (await client.post("/v1/chat/completions", json={"messages": turn2, "max_tokens": 1,
                                                               "temperature": 0})).json()
    ttft = time.perf_counter() - t0
    usage = r2["usage"]
    computed = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    return {"first_turn_prompt_tokens": r1["usage"]["prompt_tokens"],
            "second_turn_prompt_tokens": usage["prompt_tokens"], "computed": computed, "second_turn_ttft_s": ttft}


def _run_levels(name: str, url: str, levels: list[int], max_tokens: int, no_end: dict) -> list[dict]:
    asyncio.run(_level(url, 1, 4, no_end))  # warm-up
    rows = []
    for n in levels:
        row = asyncio.run(_level(url, n, max_tokens, no_end))
        row["ratio"] = row["decode_tok_s"] / rows[0]["decode_tok_s"] if rows else 1.0
        row["steady_ratio"] = row["steady_tok_s"] / rows[0]["steady_tok_s"] if rows else 1.0
        rows.append(row)
        print(f"{name:10s} {n:3d} streams  decode {row['decode_tok_s']:7.1f} tok/s  x{row['ratio']:.2f}  "
              f"all decoding {row['steady_tok_s']:7.1f} tok/s  x{row['steady_ratio']:.2f}  "
              f"TTFT p50 {row['ttft_p50_s']:6.2f} s  p95 {row['ttft_p95_s']:6.2f} s", flush=True)
    return rows


def _serve(cmd: list[str], url: str, env: dict) -> subprocess.Popen:
    """Start a server process (its output goes to a log file: an unread pipe would fill and block it)."""
    path = Path(tempfile.gettempdir()) / f"bench_serve_{Path(cmd[0]).parent.parent.name}.log"
    with open(path, "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    _wait_ready(url, proc)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help=f"a .gguf path or one of {', '.join(MODELS)}")
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=160,
                    help="tokens a stream (a short run makes the one-stream level a fraction of a second: noisy)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prefill-chunk", type=int, default=None)
    ap.add_argument("--llama-python", default=None, help="interpreter with llama-cpp-python[server]")
    ap.add_argument("--batched-bench", action="store_true",
                    help="also run llama.cpp's llama-batched-bench at the same levels (built once)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    path = str(model_path(args.model)) if args.model in MODELS else args.model
    levels = [int(x) for x in args.levels.split(",")]
    from archrun.text.tokenizer import Tokenizer

    no_end = {str(t): -100 for t in Tokenizer.from_gguf(path).eog_ids}
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "NUMBA_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-m", "archrun.cli", "serve", path, "--port", str(port), "--parallel", str(max(levels)),
           "--threads", str(args.threads), "--ctx", "1024", "--queue", str(max(levels))]
    if args.prefill_chunk:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    print(f"{describe()}; {args.threads} threads", flush=True)
    result = {"model": Path(path).name, "threads": args.threads, "max_tokens": args.max_tokens, "machine": machine()}
    proc = _serve(cmd, url, env)
    try:
        result["archrun"] = _run_levels("archrun", url, levels, args.max_tokens, no_end)
        result["prefix_reuse"] = [asyncio.run(_second_turn(url, w)) for w in (50, 400)]
        for r in result["prefix_reuse"]:
            print(f"second chat turn after {r['first_turn_prompt_tokens']:4d} prompt tokens: "
                  f"{r['computed']} of {r['second_turn_prompt_tokens']} computed, TTFT {r['second_turn_ttft_s']:.2f} s")
    finally:
        proc.terminate()
        proc.wait(30)
    if args.llama_python:
        result["llama.cpp"] = _llama(args, path, levels, no_end)
    if args.batched_bench:
        result["llama-batched-bench"] = _batched_bench(path, levels, args.threads, args.max_tokens)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


def _llama(args: argparse.Namespace, path: str, levels: list[int], no_end: dict) -> list[dict]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [args.llama_python, "-m", "llama_cpp.server", "--model", path, "--port", str(port), "--n_threads",
           str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "4096",
           "--interrupt_requests", "False"]  # else each new request cancels the running one
    proc = _serve(cmd, url, dict(os.environ))
    try:
        return _run_levels("llama.cpp", url, levels, args.max_tokens, no_end)
    finally:
        proc.terminate()
        proc.wait(30)


def _batched_bench(path: str, levels: list[int], threads: int, max_tokens: int) -> list[dict]:
    """llama.cpp's llama-batched-bench: B sequences of 32 prompt tokens each, then max_tokens decode steps of all."""
    from llamacpp_tools import build

    exe = build()["llama-batched-bench"]
    cmd = [str(exe), "-m", path, "-c", str(max(levels) * (32 + max_tokens) + 64), "-b", "2048", "-ub", "512",
           "-npp", "32", "-ntg", str(max_tokens), "-npl", ",".join(map(str, levels)), "-t", str(threads),
           "-tb", str(threads), "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in rows:
        r["ratio"] = r["speed_tg"] / rows[0]["speed_tg"]
        print(f"llama-batched-bench {r['pl']:3d} sequences  decode {r['speed_tg']:7.1f} tok/s  x{r['ratio']:.2f}  "
              f"prompt {r['t_pp']:6.2f} s", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
