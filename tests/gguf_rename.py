"""Copy a GGUF file under another `general.architecture` (keys `<old>.*` renamed to `<new>.*`)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def rename_architecture(src: str | Path, dst: str | Path, new_arch: str) -> Path:
    """Write dst: src with its architecture string and key prefix replaced; tensors copied byte for byte."""
    r = gguf.GGUFReader(str(src))
    old = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), new_arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        key = new_arch + name[len(old):] if name.startswith(old + ".") else name
        vtype = f.types[0]
        value = f.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
