"""Prepared weight matrices and their products with float32 activations.

`prepare` turns a weight's GGUF bytes into a QMatrix once, at load; `matmul` multiplies
without materialising float32 weights:

- float32 weights stay a view of the file and go to BLAS;
- quantized and 16-bit float weights are repacked (layout.py). Few tokens (decode, n <=
  INT_MAX_TOKENS[type]): the activation is quantized to 8-bit blocks and integer kernels
  (dots.py; float kernels for F16/BF16) read the packed blocks directly, split over numba's
  threads when the matrix is big enough. Many tokens (prefill): the activation is quantized
  the same way and multiplied as an int8 GEMM (gemm.py: each row group's blocks unpacked once
  for all tokens, vpdpbusd / vpmaddubsw tiles) where the CPU has AVX2 or AVX-512 VNNI; for
  the types gemm.py does not take (and without SIMD), tiles of rows are dequantized to float32
  in a cache-sized buffer (dequant.py) and multiplied with BLAS.

Shapes and dtypes are validated here; the kernels do not bounds-check.
"""

from __future__ import annotations

import attrs
import numba
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from archrun.errors import InvalidRequest, ShapeMismatch, UnsupportedQuantType
from archrun.io import quant
from archrun.kernels._jit import LANES, QB
from archrun.kernels.matmul import blas, dequant, dots, floatmm, gemm, runtime
from archrun.kernels.matmul.layout import repack

F32, F16, BF16 = 0, 1, 30
SUPPORTED_TYPES = frozenset({F32, F16, BF16, *dots.KERNELS})

# Token counts up to which the decode kernels (dots.py) run; past them the GEMM (gemm.TYPES) or
# float32 tiles + BLAS (bench_kernels.py): 4-bit-ish types decode ~2.5x more elements per cycle
# than byte-sized and 16-bit ones.
INT_MAX_TOKENS = {t: 24 for t in dots.KERNELS} | {8: 6, 14: 6, F16: 4, BF16: 4}
# With the GEMM, from 6 tokens on (4 for the byte-sized Q8_0 and Q6_K) it beats the decode kernels
# (one thread, n = 1..24, 896-1024 x 4864: e.g. Q5_0 at 8 tokens 0.64 vs 1.19 ms, Q6_K at 4: 0.60 vs 0.77)
INT_MAX_TOKENS |= {t: 3 if t in (8, 14) else 5 for t in gemm.TYPES}
# 16-bit floats in floatmm's register tiles beat float32 tiles + BLAS at every token count (2 threads,
# F16 1536 x 576 .. 49152 x 576, n = 16 / 64 / 128: 250-268 GFLOP/s against 26 / 87-114 / 144-171)
if floatmm.REGISTERS:
    INT_MAX_TOKENS |= {F16: 1 << 30, BF16: 1 << 30}
# packed bytes below which one thread beats waking the pool (~5 us per parallel call)
PARALLEL_MIN_BYTES = 96 * 1024
# float32 elements per dequantized tile (4 MiB): fewer, larger BLAS calls beat L2-sized tiles
# (measured, 128-token prefill: Qwen2.5-0.5B 31 -> 67 tok/s, SmolLM2 100 -> 156 tok/s with 1 << 22 vs
# 1 << 18); 1 << 20 gives the compute threads (kernels.matmul.blas) several tiles to share
TILE_ELEMENTS = 1 << 20


@attrs.frozen(eq=False)
class QMatrix:
    """A weight of torch shape (n_out, n_in) prepared for `matmul`; immutable.

    nbytes counts the memory it holds: the repacked copy, or for float32 the file view.
    """

    ggml_type: int
    n_out: int
    n_in: int
    nbytes: int
    arrays: tuple = attrs.field(repr=False)  # F32: (W,); otherwise (words, *scales)

    @property
    def dense(self) -> bool:
        """Held as a float32 matrix (BLAS for every n)."""
        return self.arrays[0].ndim == 2


def _type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def _check_raw(raw_rows, ggml_type: int, n_in: int) -> None:
    if ggml_type not in SUPPORTED_TYPES:
        raise UnsupportedQuantType(f"no kernel for ggml type {_type_name(ggml_type)}")
    if not isinstance(raw_rows, np.ndarray) or raw_rows.dtype != np.uint8 or raw_rows.ndim != 2:
        raise ShapeMismatch("raw_rows must be a uint8 array [n_out, row_bytes]")
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    if n_in <= 0 or n_in % block:
        raise ShapeMismatch(f"n_in={n_in} is not a positive multiple of the {_type_name(ggml_type)} "
                            f"block {block}")
    if raw_rows.shape[1] != n_in // block * size or raw_rows.shape[0] == 0:
        raise ShapeMismatch(
            f"{_type_name(ggml_type)} rows of {n_in} elements take {n_in // block * size} bytes, "
            f"got raw rows of shape {raw_rows.shape}"
        )


def prepare(raw_rows: np.ndarray, ggml_type: int, n_in: int) -> QMatrix:
    """Prepare GGUF rows (uint8 [n_out, row_bytes], ggml shape {n_in, n_out}) for matmul.

    float32 stays a zero-copy view (raw_rows may be a read-only memmap); every other type is
    repacked once. Raises UnsupportedQuantType / ShapeMismatch.
    """
    runtime.configure()
    _check_raw(raw_rows, ggml_type, n_in)
    n_out = raw_rows.shape[0]
    if ggml_type in (F16, BF16) and n_in % QB:
        # odd widths have no lane blocks: widen to float32 (rare: norms and tiny heads)
        w = quant.dequantize(np.ascontiguousarray(raw_rows), ggml_type, (n_out, n_in))
        return QMatrix(ggml_type, n_out, n_in, w.nbytes, (w,))
    if ggml_type == F32:
        w = raw_rows.view(np.float32)
        return QMatrix(ggml_type, n_out, n_in, w.nbytes, (w,))
    arrays = repack(raw_rows, ggml_type, n_in)
    if ggml_type not in (F16, BF16):  # (read-only 16-bit float lanes compile to a 3x slower kernel)
        for a in arrays:
            a.flags.writeable = False
    return QMatrix(ggml_type, n_out, n_in, sum(a.nbytes for a in arrays), arrays)


_F32_DTYPE = np.dtype(np.float32)


def _is_f32(a) -> bool:
    return isinstance(a, np.ndarray) and (a.dtype is _F32_DTYPE or a.dtype == _F32_DTYPE)


def _check_x(w: QMatrix, x, out) -> np.ndarray:
    """Validate x float32 [n, n_in] C-contiguous and out (or allocate it); returns out."""
    if not isinstance(w, QMatrix):
        raise TypeError("matmul expects a QMatrix from kernels.prepare")
    if not _is_f32(x) or x.ndim != 2 or x.shape[1] != w.n_in or not x.flags.c_contiguous:
        raise ShapeMismatch(f"x must be C-contiguous float32 [n, {w.n_in}], got {getattr(x, 'shape', None)} "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
    if out is None:
        return np.empty((x.shape[0], w.n_out), np.float32)
    if (not _is_f32(out) or out.shape != (x.shape[0], w.n_out) or not out.flags.c_contiguous
            or not out.flags.writeable):
        raise ShapeMismatch(f"out must be a writeable C-contiguous float32 [{x.shape[0]}, {w.n_out}]")
    return out


_threads = [0]  # cached numba thread count; 0 = not read yet (reading starts the pool)


def _chunks(nbytes: int) -> int:
    """Thread chunks for one product: 1 below PARALLEL_MIN_BYTES."""
    if nbytes < PARALLEL_MIN_BYTES:
        return 1
    if not _threads[0]:
        _threads[0] = numba.get_num_threads()
    return _threads[0]


def current_threads() -> int:
    """The compute threads the kernels split products over."""
    if not _threads[0]:
        _threads[0] = numba.get_num_threads()
    return _threads[0]


def set_threads(n: int) -> None:
    """Use n compute threads for the kernels (1 <= n <= numba.config.NUMBA_NUM_THREADS)."""
    limit = numba.config.NUMBA_NUM_THREADS
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= limit:
        raise InvalidRequest(f"threads must be an integer in 1..{limit}, got {n!r}")
    runtime.configure()
    numba.set_num_threads(int(n))
    _threads[0] = int(n)


def quantizes_activations(w: QMatrix, n: int) -> bool:
    """Whether matmul(w, x) with n tokens quantizes x to 8-bit blocks (the integer path)."""
    if w.dense or w.ggml_type in (F16, BF16):
        return False
    return n <= INT_MAX_TOKENS[w.ggml_type] or w.ggml_type in gemm.KERNELS


def rows_per_pass(ggml_type: int) -> int:
    """Most rows a product of this type takes while reading the packed weights directly (the decode
    kernels or the GEMM); past it a product dequantizes float32 tiles of the whole matrix first."""
    if ggml_type in gemm.KERNELS or ggml_type not in INT_MAX_TOKENS:
        return 1 << 30
    return INT_MAX_TOKENS[ggml_type]


def _decode(w: QMatrix, x: np.ndarray, out: np.ndarray) -> None:
    """Few tokens: integer kernels (float kernels for 16-bit floats) over all row groups."""
    chunks = 1 if w.nbytes < PARALLEL_MIN_BYTES else (_threads[0] or _chunks(w.nbytes))
    if w.ggml_type == F16 or w.ggml_type == BF16:
        # the register tiles' work grows with the tokens (the weights are read once): split by both
        chunks = _chunks(w.nbytes * x.shape[0]) if floatmm.REGISTERS else chunks
        floatmm.half_run(w.arrays[0], w.ggml_type == BF16, x, out, min(chunks, w.arrays[0].shape[0]))
    else:
        dots.KERNELS[w.ggml_type](*w.arrays, x, out, chunks)


def _prefill(w: QMatrix, x: np.ndarray, out: np.ndarray) -> None:
    """Many tokens: dequantize tiles of row groups to float32 and multiply with BLAS. The tiles are
    the same whatever the thread count (a BLAS result may depend on the shape it is called with);
    whole tiles are shared among the compute threads, BLAS single-threaded in each (kernels.matmul.blas)."""
    ng = w.arrays[0].shape[0]
    step = max(1, TILE_ELEMENTS // (w.n_in * LANES))

    def tiles(a: int, b: int) -> None:
        tile = np.empty((w.n_in, min(step, ng) * LANES), np.float32)  # W rows of the tile, transposed
        for g0 in range(a * step, min(ng, b * step), step):
            g1 = min(ng, g0 + step)
            r0, r1 = g0 * LANES, min(w.n_out, g1 * LANES)
            if w.ggml_type in (F16, BF16):
                dequant.deq_float16(w.arrays[0], w.ggml_type == BF16, g0, g1, tile)
            else:
                dequant.DEQUANT[w.ggml_type](*w.arrays, g0, g1, tile)
            np.matmul(x, tile[:, :r1 - r0], out=out[:, r0:r1])

    blas.split(-(-ng // step), current_threads(), tiles)




def matmul(w: QMatrix, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x float32 [n, n_in] (C-contiguous) -> out float32 [n, n_out] = x @ W.T.

    Raises ShapeMismatch on a bad x or out.
    """
    out = _check_x(w, x, out)
    if x.shape[0] == 0:
        return out
    if w.dense:
        np.dot(x, w.arrays[0].T, out=out)
    elif x.shape[0] <= INT_MAX_TOKENS[w.ggml_type]:
        _decode(w, x, out)
    elif w.ggml_type in gemm.KERNELS:  # int8 GEMM, the row groups split over the threads
        # 4 chunks per thread: a thread that finds its core taken costs a quarter of its share
        gemm.KERNELS[w.ggml_type](*w.arrays, x, out, min(w.arrays[0].shape[0], 4 * current_threads()))
    else:
        _prefill(w, x, out)
    return out


def matmul_rows(w: QMatrix, x: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """out float32 [n, len(rows)] = x @ W[rows].T: only the selected output rows.

    Row groups containing a selected row are computed; rows must be integers in [0, n_out).
    """
    rows = np.asarray(rows)
    bad = rows.size and (rows.dtype.kind not in "iu" or rows.min() < 0 or rows.max() >= w.n_out)
    if rows.ndim != 1 or bad:
        raise ShapeMismatch(f"rows must be integers in [0, {w.n_out})")
    n = x.shape[0] if isinstance(x, np.ndarray) and x.ndim == 2 else -1
    if out is not None and (not isinstance(out, np.ndarray) or out.shape != (n, rows.size)
                            or out.dtype != np.float32):
        raise ShapeMismatch(f"out must be float32 [{n}, {rows.size}]")
    if rows.size * LANES * 2 > w.n_out or w.dense:
        full = matmul(w, x)
    else:
        _check_x(w, x, None)
        full = _some_rows(w, x, rows)
    res = full[:, rows]
    if out is None:
        return res
    out[...] = res
    return out


def _some_rows(w: QMatrix, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[n, n_out] with only the row groups holding `rows` computed (the rest zero)."""
    full = np.zeros((x.shape[0], w.n_out), np.float32)
    for g in np.unique(rows // LANES):
        part = QMatrix(w.ggml_type, min(LANES, w.n_out - g * LANES), w.n_in, 0,
                       tuple(a[g:g + 1] for a in w.arrays))
        full[:, g * LANES:g * LANES + part.n_out] = matmul(part, x)
    return full


def embedding_rows(raw_rows: np.ndarray, ggml_type: int, n_in: int, ids: np.ndarray) -> np.ndarray:
    """float32 [len(ids), n_in]: rows `ids` of GGUF rows, dequantized exactly (token lookup).

    Bit-identical to gguf.quants.dequantize of those rows. Raises InvalidRequest on ids
    outside [0, n_out) and UnsupportedQuantType / ShapeMismatch on a bad matrix.
    """
    _check_raw(raw_rows, ggml_type, n_in)
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InvalidRequest("ids must be a 1-D integer array")
    if ids.size and (ids.min() < 0 or ids.max() >= raw_rows.shape[0]):
        raise InvalidRequest(f"token ids must be in [0, {raw_rows.shape[0]})")
    sel = np.ascontiguousarray(raw_rows[ids.astype(np.intp)])
    return quant.dequantize(sel, ggml_type, (ids.size, n_in))


__all__ = ["QMatrix", "SUPPORTED_TYPES", "embedding_rows", "matmul", "matmul_rows", "prepare",
           "quantizes_activations", "set_threads"]
