"""Logit-bit hashes: archrun's exact output on one machine class, pinned so a change of one bit fails.

These are **not correctness goldens**: they record archrun's own output (correctness comes only from
HF and llama.cpp, ``archrun.conformance.hf``). They catch a refactor that changes any output bit —
a reordered sum, another kernel dispatch, a changed constant — where tolerances cannot see it.

Bits depend on more than archrun's code, so each record names its **machine class**
(``machine_class()``): the CPU as LLVM sees it (name and the instruction-set features that change
numba's code generation and numpy's/OpenBLAS's kernel dispatch), numba, llvmlite, numpy and its
BLAS, gguf (which writes the synthetic inputs), the C library, Python, and the environment
overrides of numba's and numpy's targets. A package's records live in ``tests/logit_hashes/<class
id>.json`` (``class_id``); a check on another class is skipped with the differences as its reason.

What is hashed, per model (a synthetic variant or a tiny HF fixture) and backend: FNV-1a (64-bit)
of the float32 bytes of the logits at each position, for the whole prompt through the cache
(``prefill``) and token by token (``decode``; fused on the fast backend), with the input file's
SHA-256 and the token ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archrun.generation.fnv import fnv1a64_rows

FOLDER = "logit_hashes"
FORMAT = 1

#: LLVM feature-name prefixes that change instruction selection for float and integer SIMD math
_SIMD_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "xop", "neon", "sve", "fp-armv8", "fullfp16",
                  "fp16", "bf16", "dotprod", "i8mm", "altivec", "vsx")
#: environment variables that change numba's or numpy's target or math
_ENV = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT", "NUMBA_DISABLE_JIT", "NUMBA_FASTMATH",
        "NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES", "OPENBLAS_CORETYPE")


# ------------------------------------------------------------------------------ hashing


def logit_hashes(model: Any, ids: np.ndarray) -> dict[str, list[str]]:
    """{"prefill": hashes per position of one cached prefill, "decode": of token-by-token steps}."""
    cache = model.init_cache(len(ids))
    prefill = model.forward_step(ids, cache, all_logits=True)
    cache = model.init_cache(len(ids))
    decode = np.stack([model.forward_step([t], cache) for t in ids])
    return {"prefill": fnv1a64_rows(prefill), "decode": fnv1a64_rows(decode)}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------ machine class


def _cpu() -> tuple[str, list[str]]:
    from llvmlite import binding

    try:
        name = binding.get_host_cpu_name()
        features = binding.get_host_cpu_features()
    except RuntimeError:  # no feature map on this platform
        return platform.processor() or "unknown", []
    simd = sorted(f for f, on in features.items() if on and f.startswith(_SIMD_PREFIXES))
    return name, simd


def _numpy_simd() -> list[str]:
    """numpy's runtime-dispatched SIMD targets (what its ufunc loops use on this host)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:
        return []
    return sorted(f for f, on in found.items() if on)


def _blas() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (KeyError, TypeError):
        return "unknown"
    return f"{blas.get('name', '?')} {blas.get('version', '?')}"


def machine_class() -> dict[str, Any]:
    """What archrun's output bits depend on besides its own code (see the module docstring)."""
    import gguf
    import llvmlite
    import numba

    cpu, simd = _cpu()
    return {
        "machine": platform.machine(), "system": platform.system(), "libc": " ".join(platform.libc_ver()),
        "python": ".".join(platform.python_version_tuple()[:2]),
        "cpu": cpu, "cpu_simd_features": simd, "numpy_simd": _numpy_simd(),
        "numba": numba.__version__, "llvmlite": llvmlite.__version__, "numpy": np.__version__, "blas": _blas(),
        "gguf": _version("gguf", gguf),
        "numba_svml": bool(getattr(numba.config, "USING_SVML", False)),
        "env": {k: os.environ[k] for k in _ENV if k in os.environ},
    }


def _version(dist: str, module: Any) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return getattr(module, "__version__", None) or version(dist)
    except PackageNotFoundError:
        return "unknown"


def class_id(cls: Mapping[str, Any]) -> str:
    """A short stable name of a machine class (the file name of its records)."""
    return hashlib.sha256(json.dumps(cls, sort_keys=True).encode()).hexdigest()[:16]


def describe(cls: Mapping[str, Any]) -> str:
    """One line naming a machine class."""
    return (f"{cls['machine']} {cls['cpu']} ({len(cls['cpu_simd_features'])} SIMD features), numba {cls['numba']}, "
            f"llvmlite {cls['llvmlite']}, numpy {cls['numpy']} ({cls['blas']}), python {cls['python']}, "
            f"{cls['libc']}")


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The fields in which machine class ``a`` (this host) differs from ``b`` (a record's)."""
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {_short(a.get(key))} here, {_short(b.get(key))} recorded")
    return out


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + " ".join(value[:12]) + (" ..." if len(value) > 12 else "") + "]"
    return repr(value)


# ------------------------------------------------------------------------------ records


def records_dir(tests: Path) -> Path:
    return Path(tests) / FOLDER


def read_records(tests: Path) -> list[dict[str, Any]]:
    """Every machine class's record of a package's tests folder."""
    folder = records_dir(tests)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def record_for(tests: Path, cls: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(the record of machine class ``cls``, or None with the reason to skip)."""
    records = read_records(tests)
    for rec in records:
        if rec.get("machine_class") == cls:
            return rec, ""
    if not records:
        return None, (f"no logit-bit hashes recorded in {records_dir(tests)} (archrun conformance record PACKAGE "
                      f"--hashes records them for this machine class: {describe(cls)})")
    nearest = min(records, key=lambda r: len(differences(cls, r.get("machine_class", {}))))
    diff = "; ".join(differences(cls, nearest.get("machine_class", {})))
    return None, (f"logit-bit hashes are recorded for {len(records)} other machine class(es), not this one "
                  f"({class_id(cls)}); the nearest differs in {diff}")


def write_record(tests: Path, entries: Mapping[str, Any], cls: Mapping[str, Any] | None = None) -> Path:
    """Write ``entries`` (key -> entry) as this machine class's record; return its path."""
    cls = dict(machine_class() if cls is None else cls)
    folder = records_dir(tests)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{class_id(cls)}.json"
    body = {"format": FORMAT, "what": "archrun's own output bits (a regression pin, not a correctness golden)",
            "machine_class": cls, "class_id": class_id(cls), "entries": dict(sorted(entries.items()))}
    text = json.dumps(body, indent=1, sort_keys=True)
    # lists of numbers or hashes on one line each
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    path.write_text(text + "\n")
    return path


def entry(path: Path, ids: np.ndarray, model: Any) -> dict[str, Any]:
    """The record of one model file: its SHA-256, the ids and the hashes of both paths."""
    return {"input_sha256": file_sha256(path), "ids": [int(i) for i in ids], **logit_hashes(model, ids)}


def key(source: str, name: str, backend: str) -> str:
    """The record key of a model: ``synthetic/<variant>/<backend>`` or ``hf/<fixture>/<backend>``."""
    return f"{source}/{name}/{backend}"


def check_entry(recorded: Mapping[str, Any], path: Path, model: Any, what: str, cls_id: str) -> None:
    """Assert ``model`` on ``path`` reproduces ``recorded`` bit for bit; name the first changed position."""
    sha = file_sha256(path)
    assert recorded["input_sha256"] == sha, (
        f"{what}: the input file is not the one hashed (sha256 {sha[:12]}, recorded {recorded['input_sha256'][:12]}):"
        " the synthetic writer or the fixture changed; re-record: archrun conformance record PACKAGE --hashes")
    ids = np.asarray(recorded["ids"], np.int64)
    got = logit_hashes(model, ids)
    for mode in ("prefill", "decode"):
        changed = _changed(got[mode], recorded[mode])
        assert not changed, (
            f"{what} ({mode}): the logit bits changed at positions {changed[:8]}{' ...' if len(changed) > 8 else ''} "
            f"of {len(ids)} (first: position {changed[0]}, FNV-1a {got[mode][changed[0]]}, recorded "
            f"{recorded[mode][changed[0]]}) on the machine class that recorded them ({cls_id}). archrun's output "
            "is no longer bit-identical: if the change is intended (and the correctness goldens still pass), "
            "re-record: archrun conformance record PACKAGE --hashes")


def _changed(got: Sequence[str], want: Sequence[str]) -> list[int]:
    if len(got) != len(want):
        return list(range(max(len(got), len(want))))
    return [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
