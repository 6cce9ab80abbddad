"""16-bit float copies of the fetched quantized models, written once for the benchmarks.

`as_f16(src, dst)` / `as_bf16(src, dst)` write dst as src with every quantized matrix dequantized
(gguf-py) and stored as F16 or BF16 (BF16: gguf-py's rounding, as llama.cpp's converter writes it);
every other tensor and every metadata key as is (general.file_type says F16 / BF16). An existing dst is
kept. They land in the model directory's `derived/`:

    python bench/float_files.py [--dtype f16 bf16] [--models smollm2 qwen25]   # prints the paths
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from fetch_models import MODEL_DIR, model_path  # noqa: E402

DERIVED = MODEL_DIR / "derived"   # models the benches write once from the fetched ones


def as_float16(src: Path, dst: Path, dtype: str) -> Path:
    """Write dst once: src with its quantized (and F16) matrices stored as `dtype` ("f16" or "bf16")."""
    import gguf

    if dst.exists():
        return dst
    kind = {"f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
            "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16)}
    qtype, ftype = kind[dtype]
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_suffix(".part")

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(part), r.fields["general.architecture"].contents())
    w.add_file_type(ftype)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment", "general.file_type"):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(t.name, values.astype(np.float16))
        else:
            w.add_tensor(t.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.rename(dst)
    return dst


def as_f16(src: Path, dst: Path) -> Path:
    """src with every quantized matrix as F16 (see as_float16)."""
    return as_float16(src, dst, "f16")


def as_bf16(src: Path, dst: Path) -> Path:
    """src with every quantized matrix as BF16 (see as_float16)."""
    return as_float16(src, dst, "bf16")


def derived(name: str, dtype: str) -> Path:
    """The `dtype` copy of the fetched model `name` (written if missing)."""
    src = model_path(name)
    return as_float16(src, DERIVED / f"{src.stem}.{dtype}.gguf", dtype)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", nargs="+", choices=("f16", "bf16"), default=["f16", "bf16"])
    p.add_argument("--models", nargs="+", default=["smollm2", "qwen25"])
    args = p.parse_args()
    for name in args.models:
        for dtype in args.dtype:
            print(derived(name, dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
