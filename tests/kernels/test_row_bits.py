"""Each decode product kernel the host selects gives a row the same bits whatever else it computes.

Runs on every CPU class with the kernels that class selects (the VNNI row tiles, the AVX2 block dots or
the portable loops): a row alone, the same row inside products of 2..9 rows, the row groups split into
chunks, and the pooled product with its activation and output in place or through the pool's staging
buffers (strided arrays), are all the same bits. Kernel-specific checks (tiles against loops) live in
tests/kernels/test_simd.py; here only what every class must satisfy.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from support.quant_rows import QUANT, random_rows

from archrun import kernels
from archrun.io import quant
from archrun.kernels.decode import block, layer, pool
from archrun.kernels.matmul import dots, simd

SMALL = numba.config.DISABLE_JIT
N_IN, N_OUT = (64, 37) if SMALL else (256, 71)


def _prepared(name: str, rng: np.random.Generator):
    """(prepared matrix, float64 weights it holds) of random rows of type `name`."""
    raw = random_rows(name, N_OUT, N_IN, rng)
    dense = quant.dequantize(raw, int(T[name]), (N_OUT, N_IN)).astype(np.float64)
    return kernels.prepare(raw, int(T[name]), N_IN), dense


def _product(w, x: np.ndarray, chunks: int = 1) -> np.ndarray:
    out = np.full((x.shape[0], N_OUT), np.nan, np.float32)
    dots.KERNELS[w.ggml_type](*w.arrays, np.ascontiguousarray(x), out, chunks)
    return out


@pytest.mark.parametrize("name", QUANT)
def test_a_row_has_its_bits_alone_in_any_product(name):
    """Rows 1..9 of one product, and 2 chunks of row groups, equal each row's product alone, bit for bit;
    and the values are the quantized product (float64 reference of the 8-bit activation blocks)."""
    rng = np.random.default_rng(5)
    w, dense = _prepared(name, rng)
    x = rng.standard_normal((9, N_IN)).astype(np.float32)
    alone = np.concatenate([_product(w, x[i:i + 1]) for i in range(9)])
    for n in (2, 3, 4, 5, 8, 9):
        np.testing.assert_array_equal(_product(w, x[:n]).view(np.uint32), alone[:n].view(np.uint32), err_msg=n)
    np.testing.assert_array_equal(_product(w, x, chunks=2).view(np.uint32), alone.view(np.uint32))
    X, DX, _ = dots._quantized(x)
    xq = (X.astype(np.float64) * DX.astype(np.float64)[:, :, None]).reshape(9, N_IN)
    ref = xq @ dense.T
    assert np.abs(alone - ref).max() <= 1e-5 * np.abs(ref).max()


def _group(rng: np.random.Generator, name: str, n_in: int, n_out: int):
    w = kernels.prepare(random_rows(name, n_out, n_in, rng), int(T[name]), n_in)
    return (block.uniform(w), block.absent_matrix(), block.absent_matrix())


@pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_pooled_products_keep_the_bits_of_every_layout(name):
    """The pooled product through the workers, with its activation and output C-contiguous (read and
    written in place) or strided (through the staging buffers), in either order of first use: the bits
    of the one-thread product."""
    rng = np.random.default_rng(11)
    n_in, n_out, n = 768, 1536, 5  # a multiple of the K-quants' 256
    group = _group(rng, name, n_in, n_out)
    p = pool.DecodePool([group], max_in=n_in * 8, max_out=n_out * 8, serve=layer.serve)
    p.warm_up()
    wide = rng.standard_normal((n, n_in + 7)).astype(np.float32)
    x_strided, x = wide[:, 3:3 + n_in], np.ascontiguousarray(wide[:, 3:3 + n_in])
    ref = np.empty((n, n_out), np.float32)
    block.pooled_product(pool.NO_POOL, 0, group, x, ref, 1)
    with p.running(2) as par:
        for xf in (x_strided, x, x_strided):
            out = np.full((n, n_out + 4), -1.0, np.float32)
            block.pooled_product(par, 0, group, xf, out[:, 2:2 + n_out], 1)
            np.testing.assert_array_equal(out[:, 2:2 + n_out].view(np.uint32), ref.view(np.uint32))
            assert (out[:, :2] == -1).all() and (out[:, 2 + n_out:] == -1).all()
            got = np.empty((n, n_out), np.float32)
            block.pooled_product(par, 0, group, xf, got, 1)
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def _fma(a, b, c):
    """float32 fma(a, b, c) in float64 (the product is exact; one rounding of the sum, then to float32: these
    inputs never land on a float32 halfway point, where the two roundings could differ)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0"])
def test_q4_1_and_q8_0_accumulate_in_their_stated_order(name):
    """Q4_1's lane loops (AVX2 and portable hosts) and VNNI row tiles take the same float steps per block,
    acc = fma(m, dx * Sx, fma(d, sum(q x) * dx, acc)); Q8_0's tiles acc = fma(d, dx * sum(q x), acc) and its
    lane loops acc + d * (dx * sum(q x)) (docs/determinism.md): the selected kernel equals the recurrence of
    its class, written out here in numpy, bit for bit."""
    rng = np.random.default_rng(23)
    w, _ = _prepared(name, rng)
    x = rng.standard_normal((3, N_IN)).astype(np.float32)
    got = _product(w, x)
    X, DX, QH = dots._quantized(x)
    # the block fields of the same rows (random_rows with the same seed): f16 d (and m), then the quants
    nb = N_IN // 32
    rows = random_rows(name, N_OUT, N_IN, np.random.default_rng(23)).reshape(N_OUT, nb, -1)
    d = rows[:, :, 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if name == "Q4_1":
        m = rows[:, :, 2:4].copy().view("<f2")[..., 0].astype(np.float32)
        qs = rows[:, :, 4:20].astype(np.int64)
        q = np.concatenate([qs & 15, qs >> 4], axis=2)  # elements 0..15 low nibbles, 16..31 high
    else:
        m = None
        q = rows[:, :, 2:34].copy().view(np.int8).astype(np.int64)
    want = np.empty_like(got)
    for t in range(3):
        acc = np.zeros(N_OUT, np.float32)
        for b in range(nb):
            isum = (q[:, b, :] * X[t, b].astype(np.int64)).sum(axis=1).astype(np.float32)
            dx = DX[t, b]
            if name == "Q4_1":
                sx = np.float32(int(QH[t, b, 0]) + int(QH[t, b, 1]))
                acc = _fma(m[:, b], np.full(N_OUT, dx * sx, np.float32), _fma(d[:, b], isum * dx, acc))
            elif simd.VNNI:
                acc = _fma(d[:, b], dx * isum, acc)
            else:
                acc = acc + d[:, b] * (dx * isum)
        want[t] = acc
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
