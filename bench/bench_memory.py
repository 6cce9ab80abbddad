"""Peak memory of archrun on the real models: how it grows with the file, and the fixed runtime.

Each model runs in its own fresh process on the fast backend: load, a 128-token prefill, 16 decode
steps (cache of 256 tokens); the process's peak resident set (VmHWM) is read at the end. A first
process measures the import runtime alone (numpy, numba, LLVM and archrun's kernel modules
imported, no model). A least-squares line peak = slope * file + fixed over the models separates
what grows with the weights (slope: 1.0 would be one copy of the file) from what does not (fixed:
the import runtime, the compiled kernels loaded into LLVM, the tokenizer, buffers).

    python bench/bench_memory.py                 # the three real models (scripts/fetch_models.py)
    python bench/bench_memory.py --json-out results/memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from fetch_models import MODELS, model_path  # noqa: E402

PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) / 1024"

IMPORT_SNIPPET = f"""
import json
import numpy, numba, llvmlite.binding
import archrun, archrun.kernels.decode.block, archrun.kernels.decode.layer
print(json.dumps({{"peak_mb": {PEAK}}}))
"""

MODEL_SNIPPET = f"""
import json, sys
import numpy as np
import archrun
model = archrun.load(sys.argv[1], backend="fast", threads=int(sys.argv[2]))
cache = model.init_cache(256)
ids = np.random.default_rng(0).integers(0, 1000, 128).tolist()
tok = int(np.argmax(model.forward_step(ids, cache)))
for _ in range(16):
    tok = int(np.argmax(model.forward_step([tok], cache)))
print(json.dumps({{"peak_mb": {PEAK}, "cache_mb": cache.nbytes / 2**20}}))
"""


def _run(snippet: str, *args: str) -> dict:
    env = dict(os.environ, ARCHRUN_TIERED="0")
    out = subprocess.run([sys.executable, "-c", snippet, *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def main() -> int:
    if not Path("/proc/self/status").exists():
        raise SystemExit("bench_memory reads /proc/self/status (Linux)")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args()
    base = _run(IMPORT_SNIPPET)["peak_mb"]
    print(f"import runtime (numpy, numba, LLVM, archrun kernel modules): {base:.0f} MB")
    rows = []
    for name in args.models:
        path = model_path(name)
        r = _run(MODEL_SNIPPET, str(path), str(args.threads))
        r.update(model=name, file_mb=path.stat().st_size / 2**20)
        r["over_file"] = r["peak_mb"] - r["file_mb"]
        rows.append(r)
        print(f"{name}: file {r['file_mb']:.0f} MB, peak RSS {r['peak_mb']:.0f} MB "
              f"(file + {r['over_file']:.0f} MB; KV cache {r['cache_mb']:.1f} MB)", flush=True)
    report = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "import_runtime_mb": base, "rows": rows}
    if len(rows) >= 2:
        slope, fixed = _fit([r["file_mb"] for r in rows], [r["peak_mb"] for r in rows])
        report.update(slope=slope, fixed_mb=fixed)
        print(f"peak RSS = {slope:.2f} x file + {fixed:.0f} MB (least squares over {len(rows)} models; "
              f"the fixed part includes the {base:.0f} MB import runtime)")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
