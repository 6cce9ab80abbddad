"""Validated GGUF (v2/v3, little-endian) reading over a read-only memory map.

The header, metadata and tensor infos are parsed and checked before anything else sees them:
every count is bounded by the bytes left in the file before anything is allocated, every
string is bounds-checked and strict UTF-8, and tensor extents are checked for alignment,
overlap and end-of-file. Any violation raises ModelLoadError naming the key or tensor.
Tensor data is never read at open time: ``raw`` returns zero-copy views of the mapping.

File layout (all little-endian)::

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x       (key: string, value_type u32, value)
    n_tensors x  (name: string, n_dims u32, ne u64[n_dims], ggml_type u32, offset u64)
    padding to `general.alignment` (default 32), then tensor data; offsets are relative to it
    string = len u64 + UTF-8 bytes; array = elem_type u32 + count u64 + elements
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pathlib
import stat
import struct
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from archrun.errors import InvalidRequest, MissingTensor, ModelLoadError
from archrun.io import quant

__all__ = ["GGUFFile", "TensorInfo", "release_view"]

_V = GGUFValueType
_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_SCAN_BYTES = 16 << 20  # bytes of a tensor scanned for non-finite values at a time
_HEADER_BYTES = 24  # magic, version, n_tensors, n_kv
_DEFAULT_ALIGNMENT = 32
_MAX_ALIGNMENT = 1 << 24
_MAX_NAME_BYTES = 65535  # keys and tensor names
_MAX_DIMS = 4
# smallest possible encodings, used to bound counts by the bytes left in the file
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key len + 1-byte key + type + 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name len + 1-byte name + n_dims + 1 dim + type + offset

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# fixed-size value types -> (little-endian numpy dtype, struct code of the same standard size)
_FIXED: dict[GGUFValueType, tuple[str, str]] = {
    _V.UINT8: ("<u1", "B"),
    _V.INT8: ("<i1", "b"),
    _V.UINT16: ("<u2", "H"),
    _V.INT16: ("<i2", "h"),
    _V.UINT32: ("<u4", "I"),
    _V.INT32: ("<i4", "i"),
    _V.FLOAT32: ("<f4", "f"),
    _V.BOOL: ("<u1", "B"),
    _V.UINT64: ("<u8", "Q"),
    _V.INT64: ("<i8", "q"),
    _V.FLOAT64: ("<f8", "d"),
}
_NUMERIC = {t: np.dtype(dt) for t, (dt, _) in _FIXED.items()}
_SCALAR_STRUCT = {t: struct.Struct("<" + code) for t, (_, code) in _FIXED.items()}
_INTEGER_TYPES = frozenset(t for t, dt in _NUMERIC.items() if dt.kind in "iu" and t is not _V.BOOL)


@attrs.frozen
class TensorInfo:
    """One tensor's validated header entry; ``offset`` is absolute in the file."""

    name: str
    shape: tuple[int, ...]  # ggml `ne` order, fastest-varying first (as stored in the file)
    ggml_type: int  # GGMLQuantizationType value
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def np_shape(self) -> tuple[int, ...]:
        """Shape in numpy/PyTorch order (reversed ``ne``): rows first, contiguous row last."""
        return tuple(reversed(self.shape))

    @property
    def type_name(self) -> str:
        """The ggml type's name, e.g. "Q4_K"."""
        return quant.type_name(self.ggml_type)


class _Cursor:
    """Bounds-checked little-endian reads from ``buf[pos:end]``; every overrun is a ModelLoadError."""

    __slots__ = ("buf", "u8", "pos", "end")

    def __init__(self, buf: Any, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end  # end == len(buf): the whole file
        self.u8 = np.frombuffer(buf, dtype=np.uint8)

    @property
    def left(self) -> int:
        return self.end - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise ModelLoadError(
                f"truncated GGUF: {what} needs {n} bytes at offset {self.pos}, "
                f"only {self.end - self.pos} left in the file"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if max_bytes is not None and n > max_bytes:
            raise ModelLoadError(f"{what} is {n} bytes long, more than the limit of {max_bytes}")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelLoadError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def scalar(self, vtype: GGUFValueType, what: str) -> Any:
        st = _SCALAR_STRUCT[vtype]
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        if vtype is _V.BOOL:
            if v > 1:
                raise ModelLoadError(f"{what} is a bool stored as {v}, expected 0 or 1")
            return bool(v)
        return v


def _value_type(code: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise ModelLoadError(f"{what} has unknown GGUF value type {code}") from None


def _read_string_array(cur: _Cursor, count: int, what: str) -> list[str]:
    """``count`` strings: the hot path of every vocabulary (150k tokens + 150k merges).

    Large arrays of short strings take a vectorised shortcut; anything unusual about them
    (long strings, NULs, invalid UTF-8, truncation) falls back to the exact loop, which is
    also what produces every error message.
    """
    cur.need(8 * count, f"{count} strings of {what}")  # each string has at least its length
    if count >= _FAST_STRINGS_MIN:
        strings = _fast_string_array(cur, count)
        if strings is not None:
            return strings
    return _loop_string_array(cur, count, what)


def _loop_string_array(cur: _Cursor, count: int, what: str) -> list[str]:
    """One string at a time. Overruns need no per-string check: ``buf`` is the whole file, so a
    length prefix past its end makes ``unpack_from`` fail and a string past it leaves pos > end.
    """
    buf, pos, end = cur.buf, cur.pos, cur.end
    unpack = _U64.unpack_from
    out: list[str] = []
    append = out.append
    i = stop = 0
    try:
        for i in range(count):  # noqa: B007 - i names the failing element below
            pos += 8
            stop = pos + unpack(buf, pos - 8)[0]
            append(buf[pos:stop].decode())
            pos = stop
    except struct.error:
        pos = end + 1
    except UnicodeDecodeError as e:
        if stop <= end:
            raise ModelLoadError(f"{what}[{i}] is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        pos = end + 1
    if pos > end:
        raise ModelLoadError(f"truncated GGUF: {what}[{i}] runs past the end of the file")
    cur.pos = pos
    return out


# ---- vectorised string arrays -------------------------------------------------------------------

_FAST_STRINGS_MIN = 256  # below this the loop is just as fast
_FAST_STRINGS_MAX_BYTES = 16 << 20  # bounds the shortcut's temporaries (about 4x this)
_PREFIX_BYTES = np.arange(8)


class _NoShortcut(Exception):
    """The vectorised string parse does not apply; use the exact loop."""


def _fast_string_array(cur: _Cursor, count: int) -> list[str] | None:
    """Parse ``count`` strings at ``cur.pos`` with numpy, or None to make the caller loop.

    The byte window is grown until it holds every string (first guess: 24 bytes per string).
    """
    limit = min(cur.left, _FAST_STRINGS_MAX_BYTES)
    window = min(limit, 24 * count)
    try:
        while (got := _string_prefixes(cur.u8[cur.pos : cur.pos + window], count)) is None:
            if window >= limit:
                return None
            window = min(2 * window, limit)
        prefixes, end = got
        strings = _decode_joined(cur.u8[cur.pos : cur.pos + end], prefixes)
    except _NoShortcut:
        return None
    cur.pos += end
    return strings


def _short_prefixes(r: np.ndarray) -> np.ndarray:
    """Offsets p whose bytes p+1..p+7 are all zero: every length prefix of a string < 256 bytes."""
    n = len(r)
    nz = r != 0
    any_nz = nz[1 : n - 6].copy()  # any_nz[p] = any of bytes p+1 .. p+7 nonzero
    for k in range(2, 8):
        any_nz |= nz[k : n - 7 + k]
    return np.flatnonzero(~any_nz)


def _string_prefixes(r: np.ndarray, count: int) -> tuple[np.ndarray, int] | None:
    """(offsets of the ``count`` length prefixes chained from r[0], end offset), None if r is short.

    Candidates that chain (each one's length lands exactly on the next) are taken a whole run
    at a time; a string the candidates miss (>= 256 bytes) is stepped over alone. False
    candidates (zero runs inside strings) only split runs, since the walk follows lengths.
    """
    n = len(r)
    cand = _short_prefixes(r) if n >= 8 else np.zeros(0, np.intp)
    nxt = cand + 8 + r[cand]
    breaks = np.flatnonzero(nxt[:-1] != cand[1:])  # run of chained candidates ends at these
    parts: list[np.ndarray] = []
    done = pos = 0
    for _ in range(count // 64 + 64):  # many irregular strings: the loop is faster
        if done == count:
            return (np.concatenate(parts) if parts else cand[:0]), pos
        if pos > n - 8:
            return None
        i = int(np.searchsorted(cand, pos))
        if i < len(cand) and cand[i] == pos:
            b = int(np.searchsorted(breaks, i))
            last = int(breaks[b]) if b < len(breaks) else len(cand) - 1
            take = min(last - i + 1, count - done)
            parts.append(cand[i : i + take])
            pos = int(nxt[i + take - 1])
        else:
            take, parts_pos = 1, np.array([pos], np.intp)
            parts.append(parts_pos)
            pos += 8 + int.from_bytes(r[pos : pos + 8].tobytes(), "little")
        done += take
        if pos > n:
            return None
    raise _NoShortcut


def _decode_joined(r: np.ndarray, prefixes: np.ndarray) -> list[str]:
    """Decode all strings of ``r`` at once: prefixes become 8 NULs, then one decode and one split."""
    joined = r.copy()
    joined[(prefixes[:, None] + _PREFIX_BYTES).ravel()] = 0
    if len(joined) - np.count_nonzero(joined) != 8 * len(prefixes):
        raise _NoShortcut  # a string holds NUL bytes itself
    try:
        # NUL is ASCII, so this validates every string on its own: none can straddle a NUL
        text = joined.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        raise _NoShortcut from None
    return text.split("\x00" * 8)[1:]


def _read_numeric_array(cur: _Cursor, etype: GGUFValueType, count: int, what: str) -> np.ndarray:
    """``count`` fixed-size elements copied out of the map into a native numpy array."""
    dt = _NUMERIC[etype]
    cur.need(count * dt.itemsize, f"{count} x {etype.name} elements of {what}")
    arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos).astype(dt.newbyteorder("="))
    cur.pos += count * dt.itemsize
    if etype is _V.BOOL:
        if count and arr.max() > 1:
            raise ModelLoadError(f"{what} holds bool values other than 0 and 1")
        return arr.astype(bool)
    return arr


def _read_value(cur: _Cursor, vtype: GGUFValueType, what: str) -> tuple[Any, tuple]:
    """One metadata value -> (python value, value_types entry)."""
    if vtype is _V.STRING:
        return cur.string(what), (vtype,)
    if vtype is not _V.ARRAY:
        return cur.scalar(vtype, what), (vtype,)
    etype = _value_type(cur.u32(f"element type of {what}"), f"array {what}")
    if etype is _V.ARRAY:
        raise ModelLoadError(f"{what} is an array of arrays; nested arrays are not supported")
    count = cur.u64(f"element count of {what}")
    if etype is _V.STRING:
        return _read_string_array(cur, count, what), (vtype, etype)
    return _read_numeric_array(cur, etype, count, what), (vtype, etype)


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    """magic, version, counts -> (version, n_tensors, n_kv); counts bounded by the file size."""
    cur.need(4, "GGUF magic")
    if cur.buf[0:4] != _MAGIC:
        raise ModelLoadError(f"not a GGUF file: magic is {bytes(cur.buf[0:4])!r}, expected {_MAGIC!r}")
    cur.pos = 4
    cur.need(_HEADER_BYTES - 4, "GGUF header")
    version = cur.u32("version")
    if version not in _VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in _VERSIONS:
            raise ModelLoadError("big-endian GGUF files are not supported")
        raise ModelLoadError(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata key count")
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.left:
        raise ModelLoadError(
            f"GGUF header claims {n_tensors} tensors and {n_kv} metadata keys, "
            f"more than the remaining {cur.left} bytes can hold"
        )
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple]]:
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", _MAX_NAME_BYTES)
        if not key:
            raise ModelLoadError(f"metadata key #{i} is empty")
        if key in metadata:
            raise ModelLoadError(f"duplicate metadata key {key!r}")
        vtype = _value_type(cur.u32(f"value type of key {key!r}"), f"key {key!r}")
        metadata[key], value_types[key] = _read_value(cur, vtype, f"key {key!r}")
    return metadata, value_types


def _alignment(metadata: dict[str, Any], value_types: dict[str, tuple]) -> int:
    key = "general.alignment"
    if key not in metadata:
        return _DEFAULT_ALIGNMENT
    if value_types[key][0] not in _INTEGER_TYPES:
        raise ModelLoadError(f"{key} must be an integer, got {value_types[key][0].name}")
    align = int(metadata[key])
    if align <= 0 or align & (align - 1) or align > _MAX_ALIGNMENT:
        raise ModelLoadError(f"{key} = {align} is not a power of two between 1 and {_MAX_ALIGNMENT}")
    return align


def _read_dims(cur: _Cursor, name: str) -> tuple[int, ...]:
    n_dims = cur.u32(f"n_dims of tensor {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise ModelLoadError(f"tensor {name!r} has n_dims {n_dims}, expected 1..{_MAX_DIMS}")
    dims = tuple(cur.u64(f"dimensions of tensor {name!r}") for _ in range(n_dims))
    for d in dims:
        if d >= 1 << 63:
            raise ModelLoadError(f"tensor {name!r} has a negative dimension ({d - (1 << 64)})")
        if d == 0:
            raise ModelLoadError(f"tensor {name!r} has an empty dimension in shape {dims}")
    if math.prod(dims) >= 1 << 63:
        raise ModelLoadError(f"tensor {name!r}: element count of shape {dims} overflows int64")
    return dims


def _tensor_type(code: int, dims: tuple[int, ...], name: str) -> tuple[int, int]:
    """Validate the ggml type and row length -> (type, nbytes)."""
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(code)]
    except (ValueError, KeyError):
        raise ModelLoadError(f"tensor {name!r} has unknown ggml type {code}") from None
    if dims[0] % block_size:
        raise ModelLoadError(
            f"tensor {name!r}: row of {dims[0]} elements is not a multiple of the "
            f"{quant.type_name(code)} block size {block_size}"
        )
    return code, math.prod(dims) // block_size * type_size


def _read_tensor_infos(cur: _Cursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int, int]]:
    """-> [(name, ne, ggml_type, relative offset, nbytes)] in file order."""
    infos = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"name of tensor #{i}", _MAX_NAME_BYTES)
        if not name:
            raise ModelLoadError(f"tensor #{i} has an empty name")
        if name in seen:
            raise ModelLoadError(f"duplicate tensor name {name!r}")
        seen.add(name)
        dims = _read_dims(cur, name)
        ggml_type, nbytes = _tensor_type(cur.u32(f"type of tensor {name!r}"), dims, name)
        offset = cur.u64(f"offset of tensor {name!r}")
        infos.append((name, dims, ggml_type, offset, nbytes))
    return infos


def _place_tensors(infos: list, data_start: int, alignment: int, size: int) -> dict[str, TensorInfo]:
    """Check offsets (aligned, inside the file, disjoint) and build absolute TensorInfos."""
    tensors: dict[str, TensorInfo] = {}
    for name, dims, ggml_type, rel, nbytes in infos:
        if rel % alignment:
            raise ModelLoadError(f"tensor {name!r}: offset {rel} is not a multiple of alignment {alignment}")
        start = data_start + rel  # python ints: a u64 offset cannot wrap around
        if start + nbytes > size:
            raise ModelLoadError(
                f"tensor {name!r}: data [{start}, {start + nbytes}) runs past the end of the file ({size} bytes)"
            )
        tensors[name] = TensorInfo(name=name, shape=dims, ggml_type=ggml_type, offset=start, nbytes=nbytes)
    by_offset = sorted(tensors.values(), key=lambda t: t.offset)
    for a, b in zip(by_offset, by_offset[1:], strict=False):
        if a.offset + a.nbytes > b.offset:
            raise ModelLoadError(f"tensors {a.name!r} and {b.name!r} overlap in the file")
    return tensors


class GGUFFile:
    """A parsed, validated GGUF file; tensor data stays in a read-only memory map until used."""

    path: pathlib.Path
    version: int
    alignment: int
    data_offset: int  # absolute start of the tensor data section
    metadata: dict[str, Any]  # int, float, bool, str; string arrays -> list[str]; numeric -> np.ndarray
    value_types: dict[str, tuple]  # key -> (GGUFValueType,) or (GGUFValueType.ARRAY, element type)
    tensors: dict[str, TensorInfo]  # in file order

    def __init__(self, path: str | os.PathLike) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidRequest(f"a model path must be a str or os.PathLike, got {type(path).__name__}")
        self.path = pathlib.Path(path)
        self._u8: np.ndarray | None = None
        self._fd = -1
        self._checked: set[str] = set()  # tensors whose values passed the finiteness check
        self._mm, self._fd = _map_file(self.path)
        try:
            self._parse(self._mm, len(self._mm))
        except ModelLoadError as e:
            self.close()
            raise type(e)(f"{self.path.name}: {e}") from None
        self._u8 = np.frombuffer(self._mm, dtype=np.uint8)

    def _parse(self, buf: mmap.mmap, size: int) -> None:
        cur = _Cursor(buf, 0, size)
        self.version, n_tensors, n_kv = _read_header(cur)
        self.metadata, self.value_types = _read_metadata(cur, n_kv)
        self.alignment = _alignment(self.metadata, self.value_types)
        infos = _read_tensor_infos(cur, n_tensors)
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors = _place_tensors(infos, self.data_offset, self.alignment, size)

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensor(f"tensor {name!r} is not in {self.path.name}") from None

    def raw(self, name: str) -> np.ndarray:
        """Read-only uint8 view of exactly the tensor's bytes (no copy)."""
        info = self._info(name)
        if self._u8 is None:
            raise ValueError(f"{self.path.name} is closed")
        return self._u8[info.offset : info.offset + info.nbytes]

    def raw_rows(self, name: str) -> np.ndarray:
        """uint8 view (n_rows, row_bytes), n_rows = prod(np_shape[:-1]): one ggml row per line.

        The weights a model binds come through here or ``dequantize``: both refuse a tensor holding
        an Inf or NaN (a float element, or a block's scale) with ModelLoadError, before any kernel
        sees it (see ``check_finite``)."""
        info = self._info(name)
        self.check_finite(name)
        rb = quant.row_bytes(info.ggml_type, info.shape[0])
        return self.raw(name).reshape(info.nbytes // rb, rb)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array of shape ``np_shape``; UnsupportedQuantType if impossible,
        ModelLoadError if it holds Inf or NaN."""
        info = self._info(name)
        self.check_finite(name)
        return quant.dequantize(self.raw(name), info.ggml_type, info.np_shape)

    def check_finite(self, name: str) -> None:
        """ModelLoadError naming the tensor and the place when its data holds an Inf or NaN (checked
        once per tensor). archrun refuses such weights at load rather than compute NaN logits."""
        if name in self._checked:
            return
        info = self._info(name)
        raw = self.raw(name)
        unit = quant.block_info(info.ggml_type)[1]  # bytes of one element (float types) or block
        step = max(unit, _SCAN_BYTES // unit * unit)
        for start in range(0, len(raw), step):
            part = raw[start:start + step]
            bad = quant.first_non_finite(part, info.ggml_type)
            # the scan made these pages resident: let them go before the next range, so a big
            # tensor never sits in memory twice (its file pages and the repacked copy made next)
            release_view(part)
            if bad is not None:
                what, index = bad
                raise ModelLoadError(f"{self.path.name}: tensor {name!r} ({info.type_name}) holds a non-finite "
                                     f"value (Inf or NaN) in its {what} {index + start // unit}; archrun refuses "
                                     "such weights")
        self._checked.add(name)

    def check_intact(self) -> None:
        """ModelLoadError when the file shrank since it was opened.

        Weights are memory-mapped: reading a page past a truncated file's new end kills the process
        with SIGBUS. The model calls this before each step, so a file truncated (or rewritten in
        place) after load fails with a typed error instead; a truncation racing a running step is
        not caught (as with llama.cpp's mmap loading: do not modify a model file while it is in use).
        """
        if self._fd < 0:
            return
        try:
            size = os.fstat(self._fd).st_size
        except OSError as e:
            raise ModelLoadError(f"{self.path.name}: cannot check the model file: {e.strerror or e}") from None
        if size < len(self._mm):
            raise ModelLoadError(f"{self.path.name} shrank from {len(self._mm)} to {size} bytes after it was loaded: "
                                 "its memory-mapped weights are gone; load the model again")

    @property
    def paths(self) -> tuple[pathlib.Path, ...]:
        """The files the model is read from: this one (a GGUFSet has one per part)."""
        return (self.path,)

    def identity(self) -> tuple:
        """What names the file's contents on disk: (device, inode, size, mtime), or its path when unknown."""
        try:
            st = os.fstat(self._fd) if self._fd >= 0 else os.stat(self.path)
        except OSError:
            return (str(self.path),)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def release_pages(self) -> None:
        """Let the kernel drop this file's resident pages (they are re-read on demand).

        Called after weights were repacked into their own buffers, so peak memory is the
        repacked model plus what is still touched (e.g. embedding rows), not that plus the file.
        """
        if hasattr(mmap, "MADV_DONTNEED") and not self._mm.closed:
            self._mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Drop the map; views handed out by ``raw`` stay valid and keep it alive until freed."""
        self._u8 = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        # with outstanding views the mapping is released together with the last of them
        with contextlib.suppress(BufferError):
            self._mm.close()

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # (os.close bound at definition: at interpreter exit the module's globals may already be None)
        fd = getattr(self, "_fd", -1)  # the descriptor check_intact reads; the map frees itself
        if fd >= 0:
            _close(fd)
            self._fd = -1

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.tensors)} tensors)"


def _map_file(path: pathlib.Path) -> tuple[mmap.mmap, int]:
    """(read-only map of the whole file, an open descriptor of it); a path that is not a regular
    file (a FIFO, a device, a directory), or is empty or unreadable, is a ModelLoadError.

    The kind is checked before opening (opening a FIFO blocks until a writer appears) and again on
    the descriptor, opened non-blocking, in case the path was swapped in between.
    """
    try:
        _check_regular(os.stat(path), path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise ModelLoadError(f"cannot open {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
        _check_regular(st, path)
        if st.st_size == 0:
            raise ModelLoadError(f"{path.name}: empty file, not a GGUF model")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), fd
    except OSError as e:
        os.close(fd)
        raise ModelLoadError(f"cannot map {path}: {e.strerror or e}") from None
    except BaseException:
        os.close(fd)
        raise


def _check_regular(st: os.stat_result, path: pathlib.Path) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a special file")
        raise ModelLoadError(f"cannot open {path}: it is {kind}, not a GGUF file")


def release_view(view: np.ndarray) -> None:
    """Let the OS drop the resident pages under `view` if it is a view of a GGUFFile's mapping.

    For callers that copied a tensor's bytes into their own buffers (the fast backend's
    repack): the pages are re-read from the page cache if the view is used again. Any other
    array (or a closed file) is left alone. Pages only partly under the view are dropped too.
    """
    owner = view
    while isinstance(owner.base, np.ndarray):  # numpy collapses views onto the frombuffer array
        owner = owner.base
    mm = owner.base.obj if isinstance(owner.base, memoryview) else None
    if not isinstance(mm, mmap.mmap) or mm.closed or not hasattr(mmap, "MADV_DONTNEED") or view.size == 0:
        return
    start = view.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    end = start + view.nbytes
    page = mmap.PAGESIZE
    first = start // page * page
    mm.madvise(mmap.MADV_DONTNEED, first, end - first)
