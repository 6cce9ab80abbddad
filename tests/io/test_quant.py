"""archrun.io.quant must match gguf.quants.dequantize bit for bit (gguf-py is the independent reference)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from support.gguf_fixtures import random_blocks

from archrun.errors import UnsupportedQuantType
from archrun.io import quant
from archrun.io.ggufset import open_gguf
from archrun.io.weights import Matrix

T = GGMLQuantizationType
MODELS = pathlib.Path.home() / ".cache" / "archrun" / "models"
REAL_MODELS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
]
ALL_SUPPORTED = sorted(T(t) for t in quant.SUPPORTED_TYPES)


def reference(raw: np.ndarray, ggml_type: int, np_shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's dequantization of ``raw`` reshaped to its byte shape (rows of blocks)."""
    block_size, type_size = GGML_QUANT_SIZES[T(ggml_type)]
    byte_shape = (*np_shape[:-1], np_shape[-1] // block_size * type_size)
    out = gq.dequantize(np.ascontiguousarray(raw).reshape(byte_shape), T(ggml_type))
    return np.asarray(out, dtype=np.float32).reshape(np_shape)


def assert_bit_identical(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    # compare bit patterns: identical NaN payloads and signed zeros included
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def shapes_for(ggml_type: int) -> list[tuple[int, ...]]:
    bs = GGML_QUANT_SIZES[T(ggml_type)][0]
    cols = max(bs, 32)
    return [(cols,), (5, 2 * cols), (2, 3, cols)]


@pytest.mark.parametrize("ggml_type", ALL_SUPPORTED, ids=lambda t: t.name)
@pytest.mark.parametrize("finite", [True, False], ids=["finite", "anybytes"])
def test_bit_identical_to_gguf_py_on_random_blocks(ggml_type: T, finite: bool) -> None:
    rng = np.random.default_rng([int(ggml_type), finite])
    bs = GGML_QUANT_SIZES[ggml_type][0]
    for shape in shapes_for(ggml_type):
        raw = random_blocks(rng, ggml_type, int(np.prod(shape)) // bs, finite=finite)
        with np.errstate(all="ignore"):
            want = reference(raw, ggml_type, shape)
        assert_bit_identical(quant.dequantize(raw, ggml_type, shape), want)


@pytest.mark.parametrize("ggml_type", ALL_SUPPORTED, ids=lambda t: t.name)
def test_many_blocks_cross_chunk_boundaries(ggml_type: T) -> None:
    """More blocks than one internal chunk, and a block count that is not a multiple of it."""
    rng = np.random.default_rng(int(ggml_type))
    bs = GGML_QUANT_SIZES[ggml_type][0]
    n_blocks = (1 << 17) // bs + 3
    raw = random_blocks(rng, ggml_type, n_blocks)
    shape = (n_blocks, bs) if bs > 1 else (n_blocks // 32, 32)
    raw = raw[: int(np.prod(shape)) // bs]
    assert_bit_identical(quant.dequantize(raw, ggml_type, shape), reference(raw, ggml_type, shape))


def test_accepts_any_raw_shape_and_noncontiguous_input() -> None:
    rng = np.random.default_rng(1)
    raw = random_blocks(rng, T.Q4_K, 6)
    want = reference(raw, T.Q4_K, (3, 512))
    assert_bit_identical(quant.dequantize(raw.ravel(), T.Q4_K, (3, 512)), want)
    assert_bit_identical(quant.dequantize(raw.reshape(3, -1), T.Q4_K, (3, 512)), want)
    wide = np.zeros((6, 2 * raw.shape[1]), np.uint8)
    wide[:, ::2] = raw
    assert_bit_identical(quant.dequantize(wide[:, ::2], T.Q4_K, (3, 512)), want)


def test_block_info_and_row_bytes() -> None:
    assert quant.block_info(T.Q4_K) == (256, 144)
    assert quant.block_info(T.Q8_0) == (32, 34)
    assert quant.block_info(T.F16) == (1, 2)
    assert quant.block_info(T.IQ4_XS) == GGML_QUANT_SIZES[T.IQ4_XS]  # layout known, not supported
    assert quant.row_bytes(T.Q6_K, 512) == 420
    assert quant.row_bytes(T.F32, 7) == 28
    with pytest.raises(ValueError, match="block size 32"):
        quant.row_bytes(T.Q8_0, 48)
    with pytest.raises(ValueError):
        quant.row_bytes(T.Q8_0, 0)
    with pytest.raises(UnsupportedQuantType, match="99"):
        quant.block_info(99)


def test_supported_types() -> None:
    names = {T(t).name for t in quant.SUPPORTED_TYPES}
    assert names == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4",
                     "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ1_0", "TQ2_0"}  # fmt: skip


@pytest.mark.parametrize("ggml_type", [T.IQ4_XS, T.IQ2_XXS, T.Q8_K, T.IQ1_S, T.F64, T.I8])
def test_unsupported_type_is_named(ggml_type: T) -> None:
    bs, ts = GGML_QUANT_SIZES[ggml_type]
    raw = np.zeros(ts * 2, np.uint8)
    with pytest.raises(UnsupportedQuantType, match=ggml_type.name):
        quant.dequantize(raw, ggml_type, (2 * bs,))


def test_unknown_type_number() -> None:
    with pytest.raises(UnsupportedQuantType, match="99"):
        quant.dequantize(np.zeros(4, np.uint8), 99, (1,))


def test_size_mismatch_is_rejected() -> None:
    raw = np.zeros(34 * 2, np.uint8)
    with pytest.raises(ValueError, match="needs 102 bytes"):
        quant.dequantize(raw, T.Q8_0, (96,))
    with pytest.raises(ValueError, match="block size"):
        quant.dequantize(raw, T.Q8_0, (2, 33))
    with pytest.raises(ValueError, match="dtype"):
        quant.dequantize(raw.view(np.int8), T.Q8_0, (64,))


def _real_tensors():
    """(model, tensor) pairs covering every type of the three real models, two tensors per type."""
    params = []
    for model in REAL_MODELS:
        path = MODELS / model
        if not path.exists():
            params.append(pytest.param(model, None, marks=pytest.mark.skip(reason=f"{model} not fetched")))
            continue
        with open_gguf(path) as f:
            per_type: dict[int, list[str]] = {}
            for t in f.tensors.values():
                per_type.setdefault(t.ggml_type, []).append(t.name)
        for names in per_type.values():
            params += [pytest.param(model, n, id=f"{model.split('-')[0]}-{n}") for n in names[:2]]
    return params


@pytest.mark.parametrize(("model", "name"), _real_tensors())
def test_bit_identical_on_real_model_tensors(model: str, name: str) -> None:
    with open_gguf(MODELS / model) as f:
        info = f.tensors[name]
        rows = f.raw_rows(name)[:64]  # first rows only: the embeddings are 150k rows long
        shape = (rows.shape[0], info.shape[0])
        assert_bit_identical(quant.dequantize(rows, info.ggml_type, shape), reference(rows, info.ggml_type, shape))


# -- MXFP4 (gpt-oss experts) ---------------------------------------------------------------------


def _mxfp4_blocks(seed: int = 3, rows: int = 6, cols: int = 96):
    import gguf
    from gguf import quants

    rng = np.random.default_rng(seed)
    x = (rng.normal(0, 1, (rows, cols)) * np.exp(rng.normal(0, 2, (rows, 1)))).astype(np.float32)
    raw = quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    return raw, quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4)


def test_mxfp4_dequantizes_as_gguf_py_does():
    raw, want = _mxfp4_blocks()
    assert np.array_equal(quant.dequantize(raw, quant.MXFP4, want.shape), want)


def _every_mxfp4_value() -> np.ndarray:
    """MXFP4 rows holding every code under every E8M0 scale: 256 blocks of 32 (each code twice)."""
    raw = np.empty((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    return raw.reshape(4, 64 * 17)


def test_mxfp4_runs_exactly_as_bf16_in_the_fast_engine():
    raw = _every_mxfp4_value()
    # every value, the subnormal scales 2^-128 and 2^-127 and the ones whose products overflow to Inf included
    with np.errstate(over="ignore"):
        want = quant.dequantize(raw, quant.MXFP4, (4, 64 * 32))
        assert np.array_equal(quant.dequantize(quant.mxfp4_as_bf16(raw), quant.BF16, want.shape), want)
    tiny = np.abs(want[want != 0]).min()
    assert np.isinf(want).any() and tiny == 2.0 ** -128 and tiny < np.finfo(np.float32).tiny
    raw, want = _mxfp4_blocks(4)
    m = Matrix(raw, quant.MXFP4, want.shape[1], "fast")
    x = np.random.default_rng(5).normal(0, 1, (3, want.shape[1])).astype(np.float32)
    y = m(x)  # float32 activations on the BF16 kernels: the dequantized weights' products, summed in float32
    assert m.prepared.ggml_type == quant.BF16
    exact = x.astype(np.float64) @ want.T.astype(np.float64)
    assert np.abs(y - exact).max() <= 1e-6 * np.abs(exact).max()
    assert np.array_equal(m(x[1:2])[0], y[1])  # a row's bits do not depend on the rows beside it


def test_mxfp4_scales_beyond_float16_run_and_overflowing_blocks_are_found():
    raw, _ = _mxfp4_blocks(6, rows=1, cols=64)
    big = raw.copy()
    big[0, 17] = 128 + 20  # block 1 scaled by 2^20: beyond float16, held exactly by bfloat16
    want = quant.dequantize(big, quant.MXFP4, (1, 64))
    assert np.array_equal(quant.dequantize(quant.mxfp4_as_bf16(big), quant.BF16, (1, 64)), want)
    assert quant.first_non_finite(big, quant.MXFP4) is None  # large, yet finite
    inf = raw.copy()
    inf[0, 17], inf[0, 18] = 254, 0x07  # code 12 times 2^126 overflows float32
    assert quant.first_non_finite(inf, quant.MXFP4) == ("scale of block", 1)
    with np.errstate(over="ignore"):
        assert np.isinf(quant.dequantize(inf, quant.MXFP4, (1, 64))).any()
    assert quant.first_non_finite(raw, quant.MXFP4) is None
