"""Benchmark archrun.kernels matmul: decode matvec GB/s and prefill GFLOP/s per ggml type.

    PYTHONPATH=core python bench/bench_kernels.py [--synthetic] [--models] [--products] [--threads N] [--seconds S]

--threads N sets numba's and OpenBLAS's thread counts (use 1 on a busy machine: 2-thread
barriers stall for milliseconds when another process holds a core).

Synthetic: random GGUF blocks of every type on realistic (n_out, n_in) shapes; enough copies
are cycled that weights stream from DRAM, not L3. Models: the real matrices of the GGUF
files in ~/.cache/archrun/models (read raw with gguf-py's GGUFReader); for each model the
time of one pass over every 2-D weight (what one decoded token multiplies) is reported next
to llama.cpp's decode rate on this machine class.

Decode GB/s counts GGUF bytes (what the file holds), so types compare as llama.cpp does.
Baseline: numpy `x @ W.T` on pre-dequantized float32 weights.

Last measured (2-core AMD EPYC Zen 3, AVX2, shared with other jobs; --threads 1):
- decode matvec, single thread: 4-bit/5-bit types 5-9 GB/s, Q8_0 5.5-7 GB/s, Q6_K/K-quants
  4.5-5 GB/s, BF16 6 GB/s, F16 4 GB/s; 2.5-5x faster than numpy on float32 weights.
- prefill n=128: 35-64 GFLOP/s, 85-90% of numpy's float32 GEMM on pre-dequantized weights.
- models, all matmuls of one decoded token: SmolLM2-135M Q4_1 19.9 ms, Gemma 3 270M
  Q4_K_M 44.7 ms, Qwen2.5-0.5B Q4_K_M 77.9 ms; llama.cpp (1 thread, same machine, same
  minute, whole model): 27.9 / 50.8 / 70 ms per token. Repacked size x1.09-1.16 of the GGUF
  matrices, prepare 0.9-3.4 s.
- two threads: a parallel region waits for the second core; with another process on it,
  GNU OpenMP's default spinning turns that into milliseconds per call (OMP_WAIT_POLICY=PASSIVE
  or --threads 1 avoid it), so multi-thread numbers need an idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__" and "--threads" in sys.argv:  # BLAS reads its thread count at import
    os.environ.setdefault("OPENBLAS_NUM_THREADS", sys.argv[sys.argv.index("--threads") + 1])

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader  # noqa: E402

from archrun import kernels  # noqa: E402
from archrun.io import quant  # noqa: E402

MODELS = Path.home() / ".cache" / "archrun" / "models"
# llama.cpp llama-bench, 2 threads, this machine class (docs/performance.md): decode tok/s
LLAMA_CPP_DECODE = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": 121,
    "gemma-3-270m-q4_k_m.gguf": 78,
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": 48,
}
SHAPES = [(4864, 896), (896, 4864), (1536, 576), (151936, 896)]  # (n_out, n_in)
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32"]
STREAM_BYTES = 96 << 20  # cycle this many bytes of weight copies so decode reads DRAM


def random_rows(ggml_type: int, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """Valid GGUF rows: random quant bits, small finite f16 scales (or random floats)."""
    t = GGMLQuantizationType(ggml_type)
    if t == GGMLQuantizationType.F32:
        return rng.standard_normal((n_out, n_in), np.float32).view(np.uint8)
    if t in (GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        f = rng.standard_normal((n_out, n_in), np.float32)
        bits = f.astype(np.float16).view(np.uint16) if t == GGMLQuantizationType.F16 else \
            (f.view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8)
    block, size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (n_out, n_in // block * size), dtype=np.uint8)
    scale_offsets = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
                     "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}[t.name]
    blocks = raw.reshape(n_out, -1, size)
    for off in scale_offsets:
        scales = (rng.random(blocks.shape[:2]) * 0.01).astype("<f2")
        blocks[..., off:off + 2] = scales[..., None].view(np.uint8)
    return raw


def timed(fn, seconds: float) -> float:
    """Mean wall seconds per call of fn() over about `seconds`."""
    fn()
    reps, start = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / reps


def bench_decode(mats: list, seconds: float) -> float:
    """Wall seconds for one matvec through every matrix in mats (cycled)."""
    xs = [np.random.default_rng(0).standard_normal((1, m.n_in), np.float32) for m in mats]
    outs = [np.empty((1, m.n_out), np.float32) for m in mats]

    def run():
        for m, x, o in zip(mats, xs, outs, strict=True):
            kernels.matmul(m, x, o)

    return timed(run, seconds)


def bench_type_shape(type_name: str, shape: tuple[int, int], seconds: float, rng) -> str | None:
    t = int(GGMLQuantizationType[type_name])
    n_out, n_in = shape
    block = GGML_QUANT_SIZES[GGMLQuantizationType(t)][0]
    if n_in % block or n_out * n_in * 4 > STREAM_BYTES * 2 and block == 1:
        return None  # K-quant needs n_in % 256 == 0; skip float copies of the huge output matrix
    raw = random_rows(t, n_out, n_in, rng)
    copies = max(1, min(8, STREAM_BYTES // raw.nbytes))
    raws = [raw] + [random_rows(t, n_out, n_in, rng) for _ in range(copies - 1)]
    mats = [kernels.prepare(r, t, n_in) for r in raws]
    dec = bench_decode(mats, seconds) / copies
    x = rng.standard_normal((128, n_in), np.float32)
    pre = timed(lambda: kernels.matmul(mats[0], x), seconds)
    dense = quant.dequantize(raw, t, (n_out, n_in))
    x1 = x[:1]
    base_dec = timed(lambda: x1 @ dense.T, seconds / 2)
    base_pre = timed(lambda: x @ dense.T, seconds / 2)
    flops = 2 * 128 * n_in * n_out
    return (f"{type_name:5s} {n_out:>6}x{n_in:<5} decode {raw.nbytes / dec / 1e9:6.2f} GB/s "
            f"({dec * 1e6:7.0f} us) | f32 numpy {base_dec * 1e6:7.0f} us | prefill n=128 "
            f"{flops / pre / 1e9:6.1f} GFLOP/s | f32 numpy {flops / base_pre / 1e9:6.1f} GFLOP/s"
            f" | repacked x{mats[0].nbytes / raw.nbytes:.2f}")


# (n_out, n_in): ~Qwen2.5-0.5B FFN up (K-quants need n_in % 256 == 0) and down
PRODUCT_SHAPES = [(4864, 1024), (896, 4864)]


def bench_products(types: list[str], seconds: float, rng) -> None:
    """CPU time of one one-token decode product per type (one thread, no parallel region), and which
    block dot it runs (dots.DOT_PATHS: a SIMD byte-pair dot, or the portable lane loops)."""
    paths = getattr(kernels.matmul.dots, "DOT_PATHS", {})
    for n_out, n_in in PRODUCT_SHAPES:
        for name in types:
            t = int(GGMLQuantizationType[name])
            if t not in kernels.matmul.dots.KERNELS:
                continue
            m = kernels.prepare(random_rows(t, n_out, n_in, rng), t, n_in)
            x = rng.standard_normal((1, n_in), np.float32)
            out = np.empty((1, n_out), np.float32)
            run = kernels.matmul.dots.KERNELS[t]
            run(*m.arrays, x, out, 1)
            reps, c0, w0 = 0, time.thread_time(), time.perf_counter()
            while time.perf_counter() - w0 < seconds:
                run(*m.arrays, x, out, 1)
                reps += 1
            cpu = (time.thread_time() - c0) / reps
            print(f"product {name:5s} {n_out:>5}x{n_in:<5} {cpu * 1e6:8.1f} us CPU "
                  f"({m.nbytes / cpu / 1e9:5.2f} GB/s repacked) dot: {paths.get(t, '?')}", flush=True)


def model_matrices(path: Path) -> list[tuple[str, int, np.ndarray, int]]:
    """(name, ggml_type, raw uint8 rows, n_in) of every 2-D weight a decoded token multiplies.

    token_embd is included only when it doubles as the output matrix (tied embeddings).
    """
    tensors = GGUFReader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    found = []
    for t in tensors:
        if len(t.shape) != 2 or (t.name == "token_embd.weight" and not tied):
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])
        raw = np.asarray(t.data).reshape(n_out, -1).view(np.uint8)
        found.append((t.name, int(t.tensor_type), raw, n_in))
    return found


def bench_model(path: Path, seconds: float) -> None:
    found = model_matrices(path)
    start = time.perf_counter()
    mats = [kernels.prepare(raw, t, n_in) for _, t, raw, n_in in found]
    load = time.perf_counter() - start
    gguf_bytes = sum(raw.nbytes for _, _, raw, _ in found)
    packed = sum(m.nbytes for m in mats)
    step = bench_decode(mats, seconds)
    n_tok = 128
    pre = timed(lambda: [kernels.matmul(m, np.ones((n_tok, m.n_in), np.float32)) for m in mats], seconds)
    ref = LLAMA_CPP_DECODE.get(path.name)
    print(f"{path.name}: {len(mats)} matrices, {gguf_bytes / 1e6:.0f} MB GGUF, "
          f"repacked x{packed / gguf_bytes:.2f}, prepare {load:.1f} s")
    print(f"  decode: all matmuls of one token {step * 1e3:.2f} ms -> <= {1 / step:.0f} tok/s "
          f"({gguf_bytes / step / 1e9:.1f} GB/s); llama.cpp whole model: {ref} tok/s")
    print(f"  prefill n={n_tok}: {pre * 1e3:.0f} ms -> {n_tok / pre:.0f} tok/s (matmuls only)")
    by_type: dict[str, list] = {}
    for (_, t, raw, _), m in zip(found, mats, strict=True):
        by_type.setdefault(GGMLQuantizationType(t).name, []).append((m, raw.nbytes))
    for name, group in sorted(by_type.items()):
        sec = bench_decode([m for m, _ in group], seconds / 2)
        nbytes = sum(b for _, b in group)
        print(f"    {name:5s} x{len(group):3d}: {nbytes / sec / 1e9:6.2f} GB/s decode ({sec * 1e3:.2f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="only the synthetic shapes")
    ap.add_argument("--models", action="store_true", help="only the real models")
    ap.add_argument("--products", action="store_true",
                    help="only the one-token decode products per type (CPU time, one thread)")
    ap.add_argument("--threads", type=int, default=0, help="compute threads (default: numba's)")
    ap.add_argument("--seconds", type=float, default=1.0, help="timing budget per measurement")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated ggml type names")
    args = ap.parse_args()
    if args.threads:
        kernels.set_threads(args.threads)
    rng = np.random.default_rng(0)
    if args.products:
        bench_products(args.types.split(","), args.seconds, rng)
        return
    if not args.models:
        for shape in SHAPES:
            for name in args.types.split(","):
                line = bench_type_shape(name, shape, args.seconds, rng)
                if line:
                    print(line, flush=True)
    if not args.synthetic:
        for path in sorted(MODELS.glob("*.gguf")):
            bench_model(path, args.seconds)


if __name__ == "__main__":
    main()
