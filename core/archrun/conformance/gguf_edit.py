"""Copy a GGUF file with edits, for tests that need a variant of a fixture (gguf-py reader + writer)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def rewrite_gguf(src: str | Path, dst: str | Path, *, architecture: str | None = None,
                 drop_tensors: Iterable[str] = (), add_keys: Mapping[str, Any] | None = None,
                 add_tensors: Mapping[str, np.ndarray | tuple[np.ndarray, int]] | None = None,
                 drop_keys: Iterable[str] = (), split_max_tensors: int = 0) -> Path:
    """Write dst: src with its architecture renamed (keys `<old>.*` -> `<new>.*`), without the
    tensors whose names contain any of `drop_tensors`, and/or with `add_keys` (full key -> int,
    float, bool or str value; replacing the file's value of that key) and `add_tensors` (name ->
    array in numpy order, written as its dtype, or (raw uint8 bytes, ggml type) for a quantized
    one) added, without the keys `drop_keys` (full keys);
    everything else is copied byte for byte.
    split_max_tensors > 0 writes a split model instead, as gguf-py's writer splits one (parts of at
    most that many tensors, `<dst stem>-0000i-of-0000N.gguf` beside dst); the first part's path is
    returned."""
    import gguf

    r = gguf.GGUFReader(str(src))
    old = r.fields["general.architecture"].contents()
    new = architecture or old
    drop, drop_keys = tuple(drop_tensors), frozenset(drop_keys)
    w = gguf.GGUFWriter(str(dst), new, split_max_tensors=split_max_tensors)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        key = new + name[len(old):] if name.startswith(old + ".") else name
        if key in (add_keys or {}) or key in drop_keys:
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    for key, value in (add_keys or {}).items():
        add_key(w, key, value)
    for t in r.tensors:
        if not any(d in t.name for d in drop):
            data = np.asarray(t.data)
            # a quantized tensor's data is its bytes [rows, row bytes]: the writer derives the shape
            shape = None if data.dtype == np.uint8 else tuple(int(x) for x in reversed(t.shape))
            w.add_tensor(t.name, data, raw_shape=shape, raw_dtype=t.tensor_type)
    # (raw bytes [..., row_bytes], ggml type): a quantized tensor
    finish(w, ((name, *a) if isinstance(a, tuple) else (name, a, None) for name, a in (add_tensors or {}).items()))
    return Path(w.format_shard_names(Path(dst))[0])


def finish(w, tensors: Iterable[tuple[str, np.ndarray, int | None]]) -> None:
    """Add each (name, array, ggml type) to writer `w` (raw blocks [..., row bytes] when the type is given,
    else the array as its dtype), then write the file and close it."""
    for name, data, ggml_type in tensors:
        if ggml_type is None:
            w.add_tensor(name, np.ascontiguousarray(data))
        else:
            w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()



def add_key(w, key: str, value: Any) -> None:
    """Write one metadata value with gguf-py's typed adder for its Python type (bool, int as
    uint32 or uint64, float32, str, or a list, tuple or 1-D array as an array), or with the type
    given: ``(value, GGUFValueType)`` / ``(list, GGUFValueType.ARRAY, element type)``."""
    import gguf

    if isinstance(value, tuple) and len(value) >= 2 and isinstance(value[1], gguf.GGUFValueType):
        w.add_key_value(key, value[0], value[1], sub_type=value[2] if len(value) > 2 else None)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        (w.add_uint32 if 0 <= value < 2**32 else w.add_uint64)(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple, np.ndarray)):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"cannot write {key}={value!r}")
