"""Copy a GGUF file with edits, for tests that need a variant of a fixture (gguf-py reader + writer)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np


def rewrite_gguf(src: str | Path, dst: str | Path, *, architecture: str | None = None,
                 drop_tensors: Iterable[str] = ()) -> Path:
    """Write dst: src with its architecture renamed (keys `<old>.*` -> `<new>.*`) and/or without
    the tensors whose names contain any of `drop_tensors`; everything else is copied byte for byte."""
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
    for t in r.tensors:
        if not any(d in t.name for d in drop):
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
