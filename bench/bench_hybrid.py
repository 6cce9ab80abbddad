"""Decode speed of a hybrid (recurrent + attention) model at a short and a long context, archrun vs llama.cpp.

    .venv/bin/python bench/bench_hybrid.py [--arch granitehybrid|lfm2|qwen3next|falcon-h1] [--dtype f32|q8_0]
        [--contexts 512 8192] [--steps 32] [--op-by-op] [--llama-python PY]

The model is a random hybrid built with transformers and converted by llama.cpp's own converter
(weights of --dtype) into bench/results/ (built once): granitehybrid, a Granite-4.0-style hybrid (d 512,
8 layers: Mamba2 mixers with one attention layer in four, a dense SwiGLU FFN; hybrid_d512.gguf), or
lfm2, an LFM2-style one (d 512, 8 layers: gated short convolutions with attention at layers 2 and 5,
a dense SwiGLU FFN; lfm2_d512.gguf), or qwen3next, a Qwen3-Next-style one (d 512, 8 layers: gated DeltaNet
mixers with gated attention at layers 3 and 7, a mixture of 16 experts, top 2, with a shared expert in every
layer; qwen3next_d512.gguf), or falcon-h1, a Falcon-H1-style one (d 512, 8 layers: attention, 8 heads over 2
KV heads, beside a Mamba2 mixer of 16 heads of 64 in every layer, a dense SwiGLU FFN; falcon_h1_d512.gguf).
For each context c a prompt of c tokens is prefilled, then --steps
single-token steps are timed (after 3 warm steps), on 1 thread. --op-by-op also times the model loaded
with fused=False (every layer op by op: what archrun ran before its layers had a fused kernel).
A recurrent layer's step costs the same at any context (its state does not grow); only the
attention layers' cost grows with c. With --llama-python (an interpreter with llama-cpp-python),
llama.cpp decodes the same file the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

CONFIG = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
          "num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": 1024,
          "mamba_n_heads": 16, "mamba_d_head": 64,
          "mamba_n_groups": 1, "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2,
          "mamba_chunk_size": 64, "position_embedding_type": None, "max_position_embeddings": 16384,
          "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
          "num_hidden_layers": 8}
LFM2_CONFIG = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
               "max_position_embeddings": 16384, "num_hidden_layers": 8,
               "layer_types": ["conv" if k == "c" else "full_attention" for k in "ccaccacc"]}
QWEN3NEXT_CONFIG = {"hidden_size": 512, "num_hidden_layers": 8, "full_attention_interval": 4, "num_attention_heads": 8,
                    "num_key_value_heads": 2, "head_dim": 64, "partial_rotary_factor": 0.25,
                    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
                    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "num_experts": 16,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512,
                    "max_position_embeddings": 16384}
FALCON_H1_CONFIG = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "head_dim": 64,
                    "num_attention_heads": 8, "num_key_value_heads": 2, "mamba_d_ssm": 1024, "mamba_n_heads": 16,
                    "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 64, "mamba_d_conv": 4,
                    "mamba_expand": 2, "mamba_chunk_size": 64, "mamba_rms_norm": True,
                    "max_position_embeddings": 16384}
# --arch -> (family package, its hf_arch spec, config, file stem)
ARCHES = {"granitehybrid": ("archrun-granitehybrid", "GRANITEHYBRID", CONFIG, "hybrid_d512"),
          "lfm2": ("archrun-lfm2", "LFM2", LFM2_CONFIG, "lfm2_d512"),
          "qwen3next": ("archrun-qwen3next", "QWEN3NEXT", QWEN3NEXT_CONFIG, "qwen3next_d512"),
          "falcon-h1": ("archrun-falcon-h1", "FALCON_H1", FALCON_H1_CONFIG, "falcon_h1_d512")}


def model_path(arch: str, dtype: str) -> Path:
    stem = ARCHES[arch][3]
    return RESULTS / (f"{stem}.gguf" if dtype == "f32" else f"{stem}_{dtype}.gguf")


def build(arch: str, dtype: str, path: Path) -> Path:
    """The random hybrid, converted by llama.cpp's converter (as the family's fixtures are)."""
    from archrun.conformance import hf

    package, name, config, stem = ARCHES[arch]
    spec = getattr(hf.load_module(ROOT / "families" / package / "tests" / "hf_arch.py"), name)
    model, _ = hf.build_tiny(spec, 0, **config)
    path.parent.mkdir(parents=True, exist_ok=True)
    return hf.convert(model, path, spec, dtype, name=stem.replace("_", "-"))


def archrun_decode(path: Path, context: int, steps: int, fused: bool = True) -> float:
    import numpy as np

    import archrun

    model = archrun.load(path, backend="fast", fused=fused)
    ids = np.random.default_rng(0).integers(0, 256, context)
    cache = model.init_cache(context + steps + 8)
    model.forward_step(ids, cache)
    for _ in range(3):
        model.forward_step([7], cache)
    t0 = time.perf_counter()
    for _ in range(steps):  # a fixed token: the cost of a step does not depend on it
        model.forward_step([7], cache)
    return steps / (time.perf_counter() - t0)


LLAMA = """
import json, sys, time, numpy as np, llama_cpp
path, context, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(path, n_ctx=context + steps + 8, n_batch=512, n_threads=1, verbose=False)
llm.eval(np.random.default_rng(0).integers(0, 256, context).tolist())
for _ in range(3):
    llm.eval([7])
t0 = time.perf_counter()
for _ in range(steps):
    llm.eval([7])
print(json.dumps(steps / (time.perf_counter() - t0)))
"""


def llama_decode(python: str, path: Path, context: int, steps: int) -> float:
    out = subprocess.run([python, "-c", LLAMA, str(path), str(context), str(steps)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"llama.cpp run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(ARCHES), default="granitehybrid")
    ap.add_argument("--dtype", choices=["f32", "q8_0"], default="f32")
    ap.add_argument("--op-by-op", action="store_true", help="also time the model with every layer op by op")
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 8192])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--llama-python", default=None)
    args = ap.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    path = model_path(args.arch, args.dtype)
    path = path if path.is_file() else build(args.arch, args.dtype, path)
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB; 1 thread; {args.steps} decode steps")
    for c in args.contexts:
        line = f"context {c:6d}: archrun {archrun_decode(path, c, args.steps):7.1f} tok/s"
        if args.op_by_op:
            line += f"   archrun op by op {archrun_decode(path, c, args.steps, fused=False):7.1f} tok/s"
        if args.llama_python:
            line += f"   llama.cpp {llama_decode(args.llama_python, path, c, args.steps):7.1f} tok/s"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
