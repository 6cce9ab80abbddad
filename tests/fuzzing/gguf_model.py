"""An editable GGUF file: parsed from a valid seed with archrun's reader, serialized byte for byte.

The fuzzer edits this model (keys, value types, tensor infos, tensor data) and then, optionally,
the serialized bytes. `serialize` takes overrides for every count and length the format stores,
so it writes the hostile files a well-behaved writer refuses to produce.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf.constants import GGUFValueType

V = GGUFValueType
_PACK = {
    V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
    V.FLOAT32: "f", V.BOOL: "B", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d",
}  # fmt: skip


@dataclass
class KV:
    """One metadata entry. `vtype`/`etype` are raw codes (may be invalid); `value` a python value,
    list, numpy array, or raw `bytes` written verbatim after the type code."""

    key: str | bytes
    vtype: int
    value: Any
    etype: int | None = None
    count: int | None = None  # stored element count override (arrays)


@dataclass
class Tensor:
    """One tensor: info fields (raw, may be invalid) and its data bytes."""

    name: str | bytes
    dims: list[int]
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative offset override
    n_dims: int | None = None  # stored n_dims override


@dataclass
class GGUFModel:
    """Header fields, metadata and tensors of one file."""

    kvs: list[KV]
    tensors: list[Tensor]
    magic: bytes = b"GGUF"
    version: int = 3
    alignment: int = 32
    n_kv: int | None = None
    n_tensors: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    def tensor(self, name: str) -> Tensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    @property
    def arch(self) -> str:
        kv = self.get("general.architecture")
        return kv.value if kv is not None and isinstance(kv.value, str) else "llama"


def parse(data: bytes, path_hint: str = "seed") -> GGUFModel:
    """Read a valid GGUF file's bytes into a GGUFModel (archrun's validating reader)."""
    import os
    import tempfile

    from archrun.io.ggufset import open_gguf

    fd, tmp = tempfile.mkstemp(suffix=".gguf")
    try:
        os.write(fd, data)
        os.close(fd)
        with open_gguf(tmp) as g:
            kvs = []
            for key, value in g.metadata.items():
                types = g.value_types[key]
                if types[0] == V.ARRAY:
                    v = list(value) if types[1] == V.STRING else np.array(value)
                    kvs.append(KV(key, int(V.ARRAY), v, int(types[1])))
                else:
                    kvs.append(KV(key, int(types[0]), value))
            tensors = [Tensor(t.name, list(t.shape), t.ggml_type, bytes(g.raw(t.name))) for t in g.tensors.values()]
            return GGUFModel(kvs=kvs, tensors=tensors, version=g.version, alignment=g.alignment)
    finally:
        os.unlink(tmp)


def _str(s: str | bytes, length: int | None = None) -> bytes:
    b = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length % (1 << 64)) + b


def _scalar(vtype: int, value: Any) -> bytes:
    code = _PACK[V(vtype)]
    if code == "f":  # as a float32 writer stores it: 1e308 becomes Inf
        with np.errstate(over="ignore"):
            return np.array([float(value)], dtype=np.float64).astype("<f4").tobytes()
    if code == "d":
        return struct.pack("<d", float(value))
    bits = struct.calcsize(code) * 8
    v = int(value)
    if code.islower():  # signed: wrap into range
        v = (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    else:
        v %= 1 << bits
    return struct.pack("<" + code, v)


def _value(vtype: int, value: Any, etype: int | None, count: int | None) -> bytes:
    if isinstance(value, bytes):
        return value
    if vtype == V.STRING:
        return _str(value)
    if vtype == V.ARRAY:
        items = list(value)
        n = len(items) if count is None else count
        head = struct.pack("<IQ", (etype or 0) % (1 << 32), n % (1 << 64))
        if etype == V.STRING:
            return head + b"".join(_str(x) for x in items)
        if etype in _PACK.values() or (etype is not None and etype in [int(t) for t in _PACK]):
            return head + b"".join(_scalar(etype, x) for x in items)
        return head + b"".join(x if isinstance(x, bytes) else b"" for x in items)
    if vtype in [int(t) for t in _PACK]:
        return _scalar(vtype, value)
    return b""  # unknown type code: no payload


def serialize(m: GGUFModel) -> bytes:
    """The file's bytes: header, KVs, tensor infos, padding, data (tensors packed in order)."""
    kv_bytes = b"".join(_str(kv.key) + struct.pack("<I", kv.vtype % (1 << 32)) +
                        _value(kv.vtype, kv.value, kv.etype, kv.count) for kv in m.kvs)
    align = m.alignment if m.alignment > 0 else 32
    offsets, data, pos = [], [], 0
    for t in m.tensors:
        pos = -(-pos // align) * align
        offsets.append(pos)
        data.append((pos, t.data))
        pos += len(t.data)
    infos = b""
    for t, off in zip(m.tensors, offsets, strict=True):
        n = len(t.dims) if t.n_dims is None else t.n_dims
        dims = b"".join(struct.pack("<Q", d % (1 << 64)) for d in t.dims)
        offset = off if t.offset is None else t.offset
        infos += _str(t.name) + struct.pack("<I", n % (1 << 32)) + dims + \
            struct.pack("<IQ", t.ggml_type % (1 << 32), offset % (1 << 64))
    n_tensors = len(m.tensors) if m.n_tensors is None else m.n_tensors
    n_kv = len(m.kvs) if m.n_kv is None else m.n_kv
    head = m.magic + struct.pack("<IQQ", m.version % (1 << 32), n_tensors % (1 << 64), n_kv % (1 << 64))
    head += kv_bytes + infos
    head += bytes(-len(head) % align)
    blob = bytearray(pos)
    for off, b in data:
        blob[off:off + len(b)] = b
    return head + bytes(blob)
