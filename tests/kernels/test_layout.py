"""The jitted load-time repack (kernels.matmul.layout.repack) against the numpy reference repack.

`repack_reference` unpacks GGUF blocks with numpy and is the readable definition of the lane
layout (the matmul tests in test_kernels.py check it end to end against gguf-py's
dequantization); `repack` must reproduce it bit for bit on random blocks of every type,
including padding rows, every f16 scale pattern and inputs split over several tasks.
Also run with NUMBA_DISABLE_JIT=1 (sizes shrink).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from archrun.kernels.matmul import layout

T = GGMLQuantizationType
SMALL = numba.config.DISABLE_JIT
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"]
N_OUT = (1, 33) if SMALL else (1, 31, 32, 71, 300)


def random_rows(name: str, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes: every quant bit pattern, scale and 16-bit float pattern (NaN, inf, subnormal)."""
    block, size = GGML_QUANT_SIZES[T[name]]
    return rng.integers(0, 256, (n_out, n_in // block * size), dtype=np.uint8)


def assert_same(got: tuple, ref: tuple) -> None:
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype == np.float32:  # NaN scales: NaN either way (payload quieting may differ)
            nan = np.isnan(b)
            assert np.array_equal(np.isnan(a), nan)
            a, b = a[~nan], b[~nan]
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("name", TYPES)
def test_repack_is_bit_identical_to_the_reference(name):
    rng = np.random.default_rng(len(name) * 7 + ord(name[-1]))
    n_in = 256 if SMALL else 512
    for n_out in N_OUT:
        raw = random_rows(name, n_out, n_in, rng)
        assert_same(layout.repack(raw, int(T[name]), n_in), layout.repack_reference(raw, int(T[name]), n_in))


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "F16"])
def test_repack_split_into_tasks(name, monkeypatch):
    monkeypatch.setattr(layout, "_TASK_BYTES", 1)  # one row group per task, over the thread pool
    rng = np.random.default_rng(3)
    raw = random_rows(name, 97 if SMALL else 200, 256, rng)
    assert_same(layout.repack(raw, int(T[name]), 256), layout.repack_reference(raw, int(T[name]), 256))


def test_repack_read_only_and_strided_input():
    rng = np.random.default_rng(5)
    raw = random_rows("Q5_0", 40, 64, rng)
    ref = layout.repack_reference(raw, int(T.Q5_0), 64)
    ro = raw.copy()
    ro.flags.writeable = False
    assert_same(layout.repack(ro, int(T.Q5_0), 64), ref)
    wide = np.zeros((40, 2 * raw.shape[1]), np.uint8)
    wide[:, ::2] = raw
    assert_same(layout.repack(wide[:, ::2], int(T.Q5_0), 64), ref)


def test_every_f16_scale_converts_like_numpy():
    """All 65536 f16 patterns as Q8_0 scales: the float32 bits numpy's conversion gives."""
    n = 2048 if SMALL else 65536
    pat = np.arange(0, 65536, 65536 // n, dtype=np.uint16)
    raw = np.zeros((pat.size, 34), np.uint8)
    raw[:, :2] = pat.view(np.uint8).reshape(-1, 2)
    d = layout.repack(raw, int(T.Q8_0), 32)[1]  # [groups, 1, LANES]: row order when flattened
    got = d.reshape(-1)[: pat.size]
    ref = pat.view("<f2").astype(np.float32)
    nan = np.isnan(ref)
    assert SMALL or nan.sum() == 2046  # every NaN pattern is there too
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
