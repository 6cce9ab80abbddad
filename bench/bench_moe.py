"""Decode tok/s of a synthetic mixture-of-experts model with and without the decode worker pool.

    PYTHONPATH=core:tests python bench/bench_moe.py [--threads 2] [--tokens 64] [--rounds 3] [--gguf PATH]

No MoE GGUF is among the real models, so this writes a qwen3moe-shaped file with the tests'
fixture tooling (tests/support/synth.py, random ggml blocks): d 1024, 8 layers, 32 experts of width 512,
8 used per token (the ratios of Qwen3-30B-A3B at a smaller scale), attention in Q4_K, expert
gate/up in Q4_K and down in Q6_K. The same loaded model decodes in alternating rounds with the pool
(every layer's products, routers and experts included, shared with the pool's workers) and
without it (the pool switched off: products split over numba's threads when big, else one
thread), so both modes see the same host load; it prints tok/s of each and their ratio.
--gguf PATH runs the same A/B on a given model instead (e.g. a dense one, to compare the pool's gain).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gguf.constants import GGMLQuantizationType as T  # noqa: E402
from support.gguf_fixtures import random_quant_tensor  # noqa: E402
from support.synth import write_model  # noqa: E402

import archrun  # noqa: E402
from archrun.kernels.matmul import qmatrix  # noqa: E402

D, LAYERS, HEADS, KV, HD, E, K, FF = 1024, 8, 16, 4, 64, 32, 8, 512


def write(path: Path) -> Path:
    rng = np.random.default_rng(0)
    overrides, types = {}, {}

    def quant(name, t, shape):
        overrides[name] = random_quant_tensor(rng, t, shape).data.reshape(*shape[:-1], -1)
        types[name] = int(t)

    for i in range(LAYERS):
        p = f"blk.{i}."
        quant(p + "attn_q.weight", T.Q4_K, (HEADS * HD, D))
        quant(p + "attn_k.weight", T.Q4_K, (KV * HD, D))
        quant(p + "attn_v.weight", T.Q4_K, (KV * HD, D))
        quant(p + "attn_output.weight", T.Q4_K, (D, HEADS * HD))
        quant(p + "ffn_gate_exps.weight", T.Q4_K, (E, FF, D))
        quant(p + "ffn_up_exps.weight", T.Q4_K, (E, FF, D))
        quant(p + "ffn_down_exps.weight", T.Q6_K, (E, D, FF))
    return write_model(path, arch="qwen3moe", n_embd=D, n_layer=LAYERS, n_head=HEADS, n_head_kv=KV, head_dim=HD,
                       n_expert=E, n_expert_used=K, n_ff_exp=FF, n_ctx=1024, tensor_overrides=overrides,
                       quant_types=types)


def decode_rate(m, tokens: int, pooled: bool, groups) -> float:
    m._decode.rest()
    m._decode._groups = groups if pooled else None  # no groups: the decode steps run without the pool
    cache = m.init_cache(tokens + 1)
    m.forward_step([3], cache)
    rng = np.random.default_rng(1)
    ids = rng.integers(4, 90, tokens)
    start = time.perf_counter()
    for t in ids:
        m.forward_step([int(t)], cache)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gguf", type=Path, help="a model file to A/B instead of the synthetic MoE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        m = archrun.load(args.gguf or write(Path(tmp) / "moe.gguf"))
        qmatrix.set_threads(args.threads)
        groups = m._decode._groups
        if groups is None:
            sys.exit("this model's decode steps have no pool (a layer does not register its products)")
        decode_rate(m, 8, True, groups)  # compile / load both paths first
        decode_rate(m, 8, False, groups)
        rates = {True: [], False: []}
        for _ in range(args.rounds):
            for pooled in (True, False):
                rates[pooled].append(decode_rate(m, args.tokens, pooled, groups))
        on, off = np.median(rates[True]), np.median(rates[False])
        what = args.gguf.name if args.gguf else f"synthetic qwen3moe d={D} {LAYERS} layers {E} experts x{FF} ({K} used)"
        print(f"{what}, {args.threads} threads: "
              f"pool {on:.1f} tok/s, no pool {off:.1f} tok/s, ratio {on / off:.2f} "
              f"(medians of {args.rounds} alternating rounds of {args.tokens} tokens)")


if __name__ == "__main__":
    main()
