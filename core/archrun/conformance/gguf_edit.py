"""Copy a GGUF file with edits, for tests that need a variant of a fixture (gguf-py reader + writer)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def rewrite_gguf(src: str | Path, dst: str | Path, *, architecture: str | None = None,
                 drop_tensors: Iterable[str] = (), add_keys: Mapping[str, Any] | None = None) -> Path:
    """Write dst: src with its architecture renamed (keys `<old>.*` -> `<new>.*`), without the
    tensors whose names contain any of `drop_tensors`, and/or with `add_keys` (full key -> int,
    float, bool or str value) added; everything else is copied byte for byte."""
    import gguf

    r = gguf.GGUFReader(str(src))
    old = r.fields["general.architecture"].contents()
    new = architecture or old
    drop = tuple(drop_tensors)
    w = gguf.GGUFWriter(str(dst), new)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        key = new + name[len(old):] if name.startswith(old + ".") else name
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    for key, value in (add_keys or {}).items():
        w.add_key_value(key, value, _value_type(value))
    for t in r.tensors:
        if not any(d in t.name for d in drop):
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def _value_type(value: Any):
    import gguf

    if isinstance(value, bool):
        return gguf.GGUFValueType.BOOL
    if isinstance(value, int):
        return gguf.GGUFValueType.UINT32
    if isinstance(value, float):
        return gguf.GGUFValueType.FLOAT32
    return gguf.GGUFValueType.STRING
