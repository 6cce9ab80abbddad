"""Constrained generation: what the grammar mask costs in decode tok/s on SmolLM2-135M-Instruct.

    python bench/bench_grammar.py [--repeat 5] [--tokens 128] [--threads N]

Each run is a whole process that loads the model, warms up, then decodes --tokens tokens greedily
from one prompt, either free or constrained by a JSON Schema (an array of at least 64 nested
objects, so the grammar never ends before the budget; end-of-generation is biased away in both so
both decode exactly --tokens tokens). Free and constrained processes alternate --repeat times;
the figure is the median of the per-pair ratios constrained / free (a shared machine is noisy,
so each pair runs back to back). Each constrained process also times the grammar's own work
(mask, check, advance) directly: its share of the decode time is the second figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))

SCHEMA = {"type": "array", "minItems": 64, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "name", "tags"],
    "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 16},
                   "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 2}}}}
PROMPT = "A JSON list of products, each with an id, a name and colour tags:\n"


def worker(mode: str, tokens: int, threads: int | None) -> dict:
    """One measurement in this process: decode tok/s (and the grammar's own time when constrained)."""
    from fetch_models import model_path

    import archrun
    from archrun.generation import grammar

    model = archrun.load(model_path("smollm2"), threads=threads)
    no_end = {t: -100.0 for t in model.tokenizer.eog_ids}
    opts = dict(max_tokens=tokens, temperature=0, logit_bias=no_end)
    if mode == "grammar":
        opts["json_schema"] = SCHEMA
    spent = _time_constraint(grammar.Constraint)
    archrun.generate(model, PROMPT, **{**opts, "max_tokens": 8}).complete()  # warm-up (and vocabulary table)
    spent.clear()
    r = archrun.generate(model, PROMPT, **opts).complete()
    assert r.completion_tokens == tokens, r.completion_tokens
    return {"mode": mode, "tok_s": r.timings["generate_tok_s"], "generate_s": r.timings["generate_s"],
            "grammar_s": sum(spent), "tokens": r.completion_tokens}


def _time_constraint(cls) -> list[float]:
    """Wrap the Constraint methods a decode step calls; returns the list their durations go to."""
    spent: list[float] = []
    for name in ("choose", "consume"):
        original = getattr(cls, name)

        def timed(self, *a, _f=original, **k):
            t0 = time.perf_counter()
            try:
                return _f(self, *a, **k)
            finally:
                spent.append(time.perf_counter() - t0)

        setattr(cls, name, timed)
    return spent


def run(mode: str, tokens: int, threads: int | None) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--tokens", str(tokens)]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--worker", choices=("free", "grammar"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokens, args.threads)))
        return
    ratios, shares, free_rates, bound_rates = [], [], [], []
    for i in range(args.repeat):
        free, bound = run("free", args.tokens, args.threads), run("grammar", args.tokens, args.threads)
        ratios.append(bound["tok_s"] / free["tok_s"])
        shares.append(bound["grammar_s"] / bound["generate_s"])
        free_rates.append(free["tok_s"])
        bound_rates.append(bound["tok_s"])
        print(f"pair {i + 1}: free {free['tok_s']:.1f} tok/s, constrained {bound['tok_s']:.1f} tok/s "
              f"(ratio {ratios[-1]:.3f}; grammar {bound['grammar_s'] * 1e3 / args.tokens:.2f} ms/token, "
              f"{shares[-1]:.1%} of decode)", flush=True)
    print(f"median: free {statistics.median(free_rates):.1f} tok/s, constrained {statistics.median(bound_rates):.1f} "
          f"tok/s, ratio {statistics.median(ratios):.3f} (cost {1 - statistics.median(ratios):.1%}); grammar's own "
          f"share of decode time {statistics.median(shares):.1%}")


if __name__ == "__main__":
    main()
