"""archrun.kernels against independent references: gguf-py dequantization and plain numpy.

Matmul references are float64 `x @ gguf.quants.dequantize(raw).T`. Few-token products
quantize the activation to 8-bit blocks (as llama.cpp does), so they are checked against the
same reference with x replaced by its gguf-py Q8_0 quantization (qs * max|x|/127, float32
scale), which is what the kernels compute, to 1e-5; the gap to the unquantized reference is
the activation rounding itself (~0.5% of max|ref| for Gaussian x) and gets a loose bound.

Also run with NUMBA_DISABLE_JIT=1 (sizes shrink) and NUMBA_BOUNDSCHECK=1.
"""

from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from support.quant_rows import FLOAT, QUANT, T, dense, q8_activation, random_rows, rel_err, tie_rows

from archrun import kernels
from archrun.errors import InvalidRequest, ShapeMismatch, UnsupportedQuantType
from archrun.kernels.matmul import dots, qmatrix

SMALL = numba.config.DISABLE_JIT  # pure-Python kernels: keep sizes tiny
TOKENS = (1, 17) if SMALL else (1, 3, 17, 64)
N_OUT = (37,) if SMALL else (37, 71)










def widths(name: str) -> tuple[int, ...]:
    block = GGML_QUANT_SIZES[T[name]][0]
    if SMALL:
        return (256,) if block == 256 else (64,)
    return (256, 512) if block == 256 else (96, 256)


def cases(names):
    return [(name, n_in) for name in names for n_in in widths(name)]




# -- matmul ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "n_in"), cases(QUANT + FLOAT))
def test_matmul_matches_gguf_dequantize(name, n_in):
    rng = np.random.default_rng(n_in + len(name))
    for n_out in N_OUT:
        raw = random_rows(name, n_out, n_in, rng)
        w = kernels.prepare(raw, int(T[name]), n_in)
        assert (w.ggml_type, w.n_out, w.n_in) == (int(T[name]), n_out, n_in) and w.nbytes > 0
        ref_w = dense(raw, name, n_in)
        for n in TOKENS:
            x = rng.standard_normal((n, n_in), np.float32)
            y = kernels.matmul(w, x)
            assert y.shape == (n, n_out) and y.dtype == np.float32
            exact = x.astype(np.float64) @ ref_w.T
            if qmatrix.quantizes_activations(w, n):
                keep = np.setdiff1d(np.arange(n), tie_rows(x))
                assert rel_err(y[keep], (q8_activation(x) @ ref_w.T)[keep]) < 1e-5
                assert rel_err(y, exact) < 3e-2  # 8-bit activation rounding only
            else:
                assert rel_err(y, exact) < 1e-5


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q5_0", "BF16"])
def test_matmul_parallel_path_and_out_buffer(name, monkeypatch):
    monkeypatch.setattr(qmatrix, "PARALLEL_MIN_BYTES", 0)  # force the thread-split kernels
    rng = np.random.default_rng(7)
    n_in = widths(name)[0]
    raw = random_rows(name, 71, n_in, rng)
    w = kernels.prepare(raw, int(T[name]), n_in)
    x = rng.standard_normal((2, n_in), np.float32)
    out = np.full((2, 71), np.nan, np.float32)
    assert kernels.matmul(w, x, out) is out
    ref = (q8_activation(x) if name != "BF16" else x.astype(np.float64)) @ dense(raw, name, n_in).T
    assert rel_err(out, ref) < 1e-5


def test_matmul_zero_tokens():
    raw = random_rows("Q4_0", 5, 64, np.random.default_rng(0))
    y = kernels.matmul(kernels.prepare(raw, int(T.Q4_0), 64), np.zeros((0, 64), np.float32))
    assert y.shape == (0, 5)


def test_matmul_rows_selects_output_rows():
    rng = np.random.default_rng(3)
    n_out, n_in = 300 if not SMALL else 100, 256
    raw = random_rows("Q4_K", n_out, n_in, rng)
    w = kernels.prepare(raw, int(T.Q4_K), n_in)
    x = rng.standard_normal((2, n_in), np.float32)
    rows = np.array([n_out - 1, 3, 3, 40])
    y = kernels.matmul_rows(w, x, rows)
    ref = q8_activation(x) @ dense(raw, "Q4_K", n_in)[rows].T
    assert y.shape == (2, 4) and rel_err(y, ref) < 1e-5
    with pytest.raises(ShapeMismatch):
        kernels.matmul_rows(w, x, np.array([n_out]))


def test_activation_quantization_is_gguf_q8_0():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 256)) * rng.uniform(0.01, 10, (3, 256))).astype(np.float32)
    x[1, :32] = 0  # an all-zero block
    X = np.empty((3, 8, 32), np.int16)
    DX = np.empty((3, 8), np.float32)
    QH = np.empty((3, 8, 2), np.int16)
    dots.quantize_act(x, X, DX, QH)
    qs = gguf.quants.quantize(x, T.Q8_0).reshape(3, 8, 34)[..., 2:].view(np.int8)
    np.testing.assert_array_equal(X, qs)
    np.testing.assert_array_equal(DX, np.abs(x.reshape(3, 8, 32)).max(-1) / np.float32(127))
    np.testing.assert_array_equal(QH, qs.reshape(3, 8, 2, 16).sum(-1))


def test_embedding_rows_bit_identical():
    rng = np.random.default_rng(11)
    for name in QUANT + FLOAT:
        n_in = widths(name)[0]
        raw = random_rows(name, 9, n_in, rng)
        ids = np.array([8, 0, 3, 3])
        got = kernels.embedding_rows(raw, int(T[name]), n_in, ids)
        want = gguf.quants.dequantize(raw[ids], T[name]).reshape(4, n_in)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    with pytest.raises(InvalidRequest):
        kernels.embedding_rows(raw, int(T[name]), n_in, np.array([9]))


def test_bad_inputs_raise_shape_mismatch():
    raw = random_rows("Q4_0", 4, 64, np.random.default_rng(0))
    w = kernels.prepare(raw, int(T.Q4_0), 64)
    bad_x = [np.zeros((1, 32), np.float32), np.zeros((1, 64), np.float64), np.zeros(64, np.float32),
             np.zeros((64, 2), np.float32).T, [[0.0] * 64]]
    for x in bad_x:
        with pytest.raises(ShapeMismatch):
            kernels.matmul(w, x)
    x = np.zeros((2, 64), np.float32)
    for out in (np.zeros((2, 5), np.float32), np.zeros((2, 4), np.float64), np.zeros((4, 2), np.float32).T):
        with pytest.raises(ShapeMismatch):
            kernels.matmul(w, x, out)
    with pytest.raises(ShapeMismatch):
        kernels.prepare(raw, int(T.Q4_0), 96)  # row bytes do not match n_in
    with pytest.raises(ShapeMismatch):
        kernels.prepare(raw, int(T.Q4_0), 48)  # not a block multiple
    with pytest.raises(ShapeMismatch):
        kernels.prepare(raw.astype(np.int16), int(T.Q4_0), 64)
    with pytest.raises(UnsupportedQuantType):
        kernels.prepare(raw, int(T.IQ2_XXS), 64)
    assert int(T.IQ2_XXS) not in kernels.SUPPORTED_TYPES


def test_prepare_keeps_f32_zero_copy_and_read_only():
    raw = random_rows("F32", 3, 40, np.random.default_rng(0))
    raw.flags.writeable = False
    w = kernels.prepare(raw, int(T.F32), 40)
    assert np.shares_memory(w.arrays[0], raw) and w.nbytes == raw.nbytes
    q = kernels.prepare(random_rows("Q8_0", 3, 64, np.random.default_rng(0)), int(T.Q8_0), 64)
    assert not any(a.flags.writeable for a in q.arrays)


def test_set_threads_validates():
    before = numba.get_num_threads()
    kernels.set_threads(1)
    assert numba.get_num_threads() == 1
    kernels.set_threads(before)
    for bad in (0, -1, 1.5, True, numba.config.NUMBA_NUM_THREADS + 1):
        with pytest.raises(InvalidRequest):
            kernels.set_threads(bad)
