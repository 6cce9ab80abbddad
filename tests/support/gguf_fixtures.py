"""Build small GGUF files for tests.

* ``write_gguf`` goes through the real ``gguf.GGUFWriter`` (the synthetic writer of the conformance kit,
  ``archrun.conformance.synthetic.write_gguf``), so files are what converters produce.
* ``RawGGUF`` writes bytes exactly as told (wrong counts, bad offsets, nested arrays, invalid
  UTF-8, ...) to make the hostile files the writer refuses to produce.
* ``random_blocks`` makes random quantized data with finite scales for every ggml block type.
"""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from archrun.conformance import synthetic

__all__ = [
    "QuantTensor",
    "RawGGUF",
    "enc_str",
    "random_blocks",
    "random_quant_tensor",
    "write_gguf",
]

T = GGMLQuantizationType
V = GGUFValueType


@attrs.frozen
class QuantTensor:
    """Raw ggml bytes for ``write_gguf``: ``data`` uint8 (n_blocks, type_size), ``np_shape`` numpy order."""

    data: np.ndarray
    ggml_type: int
    np_shape: tuple[int, ...]


def write_gguf(
    path: str | pathlib.Path,
    *,
    arch: str = "llama",
    metadata: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray | QuantTensor] | None = None,
    alignment: int | None = None,
) -> pathlib.Path:
    """Write a GGUF file with gguf.GGUFWriter (archrun.conformance.synthetic.write_gguf) and return its path.

    ``metadata`` values are plain python values (types inferred by the writer: int -> INT32,
    float -> FLOAT32, list -> ARRAY), or ``(value, GGUFValueType)`` / ``(list, ARRAY, element
    type)`` tuples for explicit types. ``tensors`` maps names to float32/float16 arrays (numpy
    order) or QuantTensor.
    """
    quant = {}
    for name, t in (tensors or {}).items():
        if isinstance(t, QuantTensor):
            block_size, type_size = GGML_QUANT_SIZES[T(t.ggml_type)]
            row_bytes = t.np_shape[-1] // block_size * type_size
            t = synthetic.Quantized(np.ascontiguousarray(t.data).reshape(*t.np_shape[:-1], row_bytes), t.ggml_type)
        quant[name] = t
    # plain ints as INT32 here (what most converters write for counts); add_key would pick UINT32
    keys = {k: (v, V.INT32) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in (metadata or {}).items()}
    return synthetic.write_gguf(path, arch, keys, quant, alignment=alignment)


# ---- byte-level builder ---------------------------------------------------------------------------


def enc_str(s: str | bytes, length: int | None = None) -> bytes:
    """GGUF string: u64 length (``length`` overrides the true one) + bytes."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


_PACK = {
    V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
    V.FLOAT32: "f", V.BOOL: "B", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d",
}  # fmt: skip


class RawGGUF:
    """A GGUF byte stream assembled piece by piece, with no validation at all.

    >>> RawGGUF().kv_u32("general.alignment", 0).tensor("w", (32,), T.F32, 0).build(data=bytes(128))
    """

    def __init__(self, version: int = 3, magic: bytes = b"GGUF") -> None:
        self.version, self.magic = version, magic
        self.kvs: list[bytes] = []
        self.infos: list[bytes] = []

    def kv_raw(self, key: str | bytes, vtype: int, payload: bytes) -> RawGGUF:
        """Key, value type number and the value's bytes, verbatim."""
        self.kvs.append(enc_str(key) + struct.pack("<I", vtype) + payload)
        return self

    def kv(self, key: str | bytes, vtype: GGUFValueType, value: Any) -> RawGGUF:
        """A scalar or string value of the given type."""
        payload = enc_str(value) if vtype == V.STRING else struct.pack("<" + _PACK[vtype], value)
        return self.kv_raw(key, vtype, payload)

    def kv_u32(self, key: str, value: int) -> RawGGUF:
        return self.kv(key, V.UINT32, value)

    def kv_str(self, key: str | bytes, value: str | bytes) -> RawGGUF:
        return self.kv(key, V.STRING, value)

    def kv_array(self, key: str, etype: int, items: list, count: int | None = None) -> RawGGUF:
        """Array of ``items`` (strings or numbers); ``count`` overrides the stored element count."""
        if etype == V.STRING:
            body = b"".join(enc_str(s) for s in items)
        elif etype in _PACK:
            body = b"".join(struct.pack("<" + _PACK[V(etype)], x) for x in items)
        else:
            body = b"".join(items)  # pre-encoded elements of an odd type
        n = len(items) if count is None else count
        return self.kv_raw(key, V.ARRAY, struct.pack("<IQ", etype, n) + body)

    def tensor(
        self, name: str | bytes, ne: tuple[int, ...], ggml_type: int, offset: int, n_dims: int | None = None
    ) -> RawGGUF:
        """A tensor info; ``ne`` in ggml order, values taken modulo 2**64 (so -1 is stored as 2**64-1)."""
        dims = b"".join(struct.pack("<Q", d % (1 << 64)) for d in ne)
        n = len(ne) if n_dims is None else n_dims
        self.infos.append(enc_str(name) + struct.pack("<I", n) + dims + struct.pack("<IQ", ggml_type, offset))
        return self

    def build(
        self, data: bytes = b"", n_tensors: int | None = None, n_kv: int | None = None, alignment: int = 32
    ) -> bytes:
        """Header + KVs + tensor infos, zero padding to ``alignment``, then ``data``."""
        nt = len(self.infos) if n_tensors is None else n_tensors
        nk = len(self.kvs) if n_kv is None else n_kv
        head = self.magic + struct.pack("<IQQ", self.version, nt, nk) + b"".join(self.kvs) + b"".join(self.infos)
        pad = -len(head) % alignment if alignment > 0 else 0
        return head + bytes(pad) + data

    def write(self, path: str | pathlib.Path, **build_kwargs: Any) -> pathlib.Path:
        path = pathlib.Path(path)
        path.write_bytes(self.build(**build_kwargs))
        return path


# ---- random quantized data ------------------------------------------------------------------------

# byte ranges of each block type's float16 scale fields (d, dmin / m)
SCALE_FIELDS: dict[int, tuple[tuple[int, int], ...]] = {
    T.Q4_0: ((0, 2),),
    T.Q4_1: ((0, 2), (2, 4)),
    T.Q5_0: ((0, 2),),
    T.Q5_1: ((0, 2), (2, 4)),
    T.Q8_0: ((0, 2),),
    T.Q2_K: ((80, 82), (82, 84)),
    T.Q3_K: ((108, 110),),
    T.Q4_K: ((0, 2), (2, 4)),
    T.Q5_K: ((0, 2), (2, 4)),
    T.Q6_K: ((208, 210),),
}


def random_blocks(rng: np.random.Generator, ggml_type: int, n_blocks: int, finite: bool = True) -> np.ndarray:
    """(n_blocks, type_size) uint8 of random data; with ``finite`` every float field is finite."""
    block_size, type_size = GGML_QUANT_SIZES[T(ggml_type)]
    if finite and ggml_type in (T.F32, T.F16, T.BF16):
        x = rng.standard_normal(n_blocks * block_size).astype(np.float32)
        if ggml_type == T.F32:
            return x.view(np.uint8).reshape(n_blocks, type_size)
        if ggml_type == T.F16:
            return x.astype(np.float16).view(np.uint8).reshape(n_blocks, type_size)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, type_size)
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if finite:
        for lo, hi in SCALE_FIELDS.get(int(ggml_type), ()):
            scale = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
            blocks[:, lo:hi] = scale.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def random_quant_tensor(
    rng: np.random.Generator, ggml_type: int, np_shape: tuple[int, ...], finite: bool = True
) -> QuantTensor:
    """A QuantTensor of ``np_shape`` (last dimension a multiple of the block size) with random blocks."""
    block_size = GGML_QUANT_SIZES[T(ggml_type)][0]
    n_blocks = int(np.prod(np_shape)) // block_size
    return QuantTensor(random_blocks(rng, ggml_type, n_blocks, finite), int(ggml_type), tuple(np_shape))
