"""A kernel's bits depend on its inputs only: not on whether the process compiled it or loaded it from the
kernel cache, on what it compiled before, on the caller's array layout or on the thread count.

Each process below computes the same decode products (quantized weights of the types the real models
use, 5 activation rows) through every entry a model reaches: the one-thread product, a single row, the
pooled product with C-contiguous and with strided activation and output. The processes differ in their
history: an empty kernel cache and one order of first use; the same cache, loaded, and the reverse order;
another empty cache, the reverse order, one thread. Every FNV-1a hash of every result must agree
(docs/determinism.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from archrun.kernels.decode import pool

pytestmark = pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")

RUN = r"""
import json, sys
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T
from archrun import kernels
from archrun.conformance.bithash import fnv1a64_rows
from archrun.kernels.decode import block, layer, pool

order, threads = sys.argv[1], int(sys.argv[2])
n_in, n_out, n = 768, 1536, 5
rng = np.random.default_rng(17)
cases = {}
for name, scale_offsets in (("Q4_1", (0, 2)), ("Q4_K", (0, 2)), ("Q6_K", (208,)), ("Q8_0", (0,))):
    # random quant bits (every pattern is valid) with small finite f16 scales
    block_elems, size = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, (n_out, n_in // block_elems, size), dtype=np.uint8)
    for off in scale_offsets:
        raw[..., off:off + 2] = (rng.standard_normal(raw.shape[:2]) * 0.01).astype("<f2")[..., None].view(np.uint8)
    w = kernels.prepare(raw.reshape(n_out, -1), int(T[name]), n_in)
    cases[name] = (block.uniform(w), block.absent_matrix(), block.absent_matrix())
wide = rng.standard_normal((n, n_in + 7)).astype(np.float32)
x_strided, x = wide[:, 3:3 + n_in], np.ascontiguousarray(wide[:, 3:3 + n_in])
p = pool.DecodePool(list(cases.values()), max_in=n_in * 8, max_out=n_out * 8, serve=layer.serve)
p.warm_up()

def one_thread(g):
    out = np.empty((n, n_out), np.float32)
    block.pooled_product(pool.NO_POOL, 0, g, x, out, 1)
    return out

def single_rows(g):
    out = np.empty((n, n_out), np.float32)
    for i in range(n):
        block.pooled_product(pool.NO_POOL, 0, g, x[i:i + 1], out[i:i + 1], 1)
    return out

def pooled(g, gid, xf, strided_out):
    with p.running(threads) as par:
        if strided_out:
            wide_out = np.zeros((n, n_out + 4), np.float32)
            block.pooled_product(par, gid, g, xf, wide_out[:, 2:2 + n_out], 1)
            return np.ascontiguousarray(wide_out[:, 2:2 + n_out])
        out = np.empty((n, n_out), np.float32)
        block.pooled_product(par, gid, g, xf, out, 1)
        return out

entries = [("pooled strided", lambda g, i: pooled(g, i, x_strided, True)),
           ("pooled in place", lambda g, i: pooled(g, i, x, False)),
           ("single rows", lambda g, i: single_rows(g)),
           ("one thread", lambda g, i: one_thread(g))]
if order == "reverse":
    entries.reverse()
hashes = {}
for gid, (name, g) in enumerate(cases.items()):
    for what, f in entries:
        hashes[f"{name} {what}"] = fnv1a64_rows(f(g, gid))
print(json.dumps(hashes))
"""


def _run(cache, order: str, threads: int) -> dict[str, list[str]]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), NUMBA_NUM_THREADS="2", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", RUN, order, str(threads)], env=env, capture_output=True,
                          text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_products_have_the_same_bits_in_every_process_history(tmp_path):
    cold = _run(tmp_path / "a", "forward", 2)           # compiles everything, strided layouts first
    warm = _run(tmp_path / "a", "reverse", 2)           # loads the same cache, contiguous and single rows first
    other = _run(tmp_path / "b", "reverse", 1)          # compiles again in the other order, one thread
    assert set(cold) == set(warm) == set(other)
    for name in sorted(cold):
        type_name = name.split()[0]
        assert cold[name] == cold[f"{type_name} one thread"], name  # every entry: the one-thread bits
        assert warm[name] == cold[name], f"{name}: loaded from the cache != compiled"
        assert other[name] == cold[name], f"{name}: another compile order / one thread != the first"
