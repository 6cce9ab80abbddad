"""llama.cpp's own HF -> GGUF converter, as vendored in llama-cpp-python's source distribution.

Fixtures of families whose ``HfArch`` says ``converter="llama.cpp"`` are converted by the real
``convert_hf_to_gguf.py`` (not by archrun's re-statement of it in ``hf.convert``), so a fixture
shows what llama.cpp's users get. The converter's source is the sdist of llama-cpp-python
``LLAMA_CPP_PYTHON``, a PyPI package: ``fetch_source()`` downloads it with pip once and keeps the
converter (``convert_hf_to_gguf.py``, ``convert_lora_to_gguf.py``, ``conversion/``, ``gguf-py/``) and the tokenizer test
vocabularies (``models/ggml-vocab-*``) under ``~/.cache/archrun/llama.cpp/<version>``
(``ARCHRUN_LLAMACPP_SRC`` names another folder).

    python -m archrun.conformance.llamacpp      # fetch the converter source, print its folder
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LLAMA_CPP_PYTHON = "0.3.36"
_SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
_VENDOR = f"{_SDIST}/vendor/llama.cpp/"
_KEEP = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/", "models/ggml-vocab-", "LICENSE")
_DRIVER = Path(__file__).with_name("llamacpp_driver.py")


class ConverterUnavailable(RuntimeError):
    """llama.cpp's converter source is not on this machine (``fetch_source()`` gets it)."""


def source_dir() -> Path:
    """The folder that holds (or will hold) the vendored llama.cpp converter."""
    env = os.environ.get("ARCHRUN_LLAMACPP_SRC")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "archrun" / "llama.cpp" / LLAMA_CPP_PYTHON


def available() -> bool:
    """True when the converter source is present (fetched)."""
    return (source_dir() / "convert_hf_to_gguf.py").is_file() and (source_dir() / "convert_lora_to_gguf.py").is_file()


def fetch_source() -> Path:
    """Download llama-cpp-python's sdist with pip (once) and extract the converter; return its folder."""
    dest = source_dir()
    if available():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
        sdist = Path(tmp) / f"{_SDIST}.tar.gz"
        staging = Path(tempfile.mkdtemp(dir=dest.parent if dest.parent.exists() else None))
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.removeprefix(_VENDOR)
                if member.name.startswith(_VENDOR) and rel.startswith(_KEEP) and member.isfile():
                    member.name = rel
                    tar.extract(member, staging, filter="data")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if (dest / "convert_hf_to_gguf.py").is_file():  # fetched before the LoRA converter was kept
        for name in ("convert_lora_to_gguf.py",):
            os.replace(staging / name, dest / name)  # one file, atomically: readers of the tree go on
    if not available():
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)  # atomic on one file system: concurrent fetches never see half a tree
    shutil.rmtree(staging, ignore_errors=True)
    return dest


def convert(model, path: str | Path, vocab: dict[str, Any], outtype: str = "f32",
            name: str | None = None, config_extra: dict[str, Any] | None = None,
            renames: Mapping[str, str] | None = None, mxfp4: tuple[str, ...] = ()) -> Path:
    """Convert an in-memory HF causal LM with llama.cpp's ``convert_hf_to_gguf.py``; return the path.

    The model is saved (safetensors, its config) to a temporary folder and converted there by
    ``llamacpp_driver.py`` in a child process; ``vocab`` (tokens, types, merges, pre, bos, eos)
    replaces the tokenizer the converter would read, which tiny models do not have;
    ``config_extra`` fields (as released checkpoints carry them) are added to the config the
    converter reads (its AutoConfig round trip drops some); ``renames`` (regex -> replacement) rename
    saved tensors back to the names released checkpoints use where transformers' save does not;
    the saved ``*.weight`` matrices whose (renamed) names match an ``mxfp4`` regex are written as
    released checkpoints hold MXFP4 (codes and ``*.scale`` exponents, ``hf.mxfp4.pack_mxfp4``).
    """
    if not available():
        raise ConverterUnavailable(f"llama.cpp's converter is not in {source_dir()}: run "
                                   "`python -m archrun.conformance.llamacpp` to fetch it")
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        model.save_pretrained(model_dir, safe_serialization=True)
        if renames or mxfp4:
            _rename_saved_tensors(model_dir, renames or {}, mxfp4)
        vocab_json = Path(tmp) / "vocab.json"
        vocab_json.write_text(json.dumps({**vocab, "config_extra": config_extra or {}}))
        args = [str(model_dir), "--outfile", str(path), "--outtype", outtype]
        if name:
            args += ["--model-name", name]
        proc = subprocess.run([sys.executable, str(_DRIVER), str(source_dir()), str(vocab_json), "--", *args],
                              capture_output=True, text=True)
    if proc.returncode != 0 or not path.is_file():
        raise RuntimeError(f"llama.cpp's converter failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return path


def _rename_saved_tensors(model_dir: Path, renames: Mapping[str, str], mxfp4: tuple[str, ...] = ()) -> None:
    """Apply ``renames`` (regex -> replacement, in order) to every tensor name of the saved safetensors,
    then pack the ``*.weight`` matrices an ``mxfp4`` regex matches into MXFP4 codes and ``*.scale``."""
    from safetensors.torch import load_file, save_file

    from archrun.conformance.hf.mxfp4 import pack_mxfp4

    for file in sorted(model_dir.glob("*.safetensors")):
        tensors = {}
        for key, value in load_file(file).items():
            for pattern, repl in renames.items():
                key = re.sub(pattern, repl, key)
            if key.endswith(".weight") and any(re.search(p, key) for p in mxfp4):
                tensors[key], tensors[key.removesuffix(".weight") + ".scale"] = pack_mxfp4(value)
                continue
            tensors[key] = value
        save_file(tensors, file, metadata={"format": "pt"})
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        renamed = {}
        for key, file in data["weight_map"].items():
            for pattern, repl in renames.items():
                key = re.sub(pattern, repl, key)
            renamed[key] = file
            if key.endswith(".weight") and any(re.search(p, key) for p in mxfp4):
                renamed[key.removesuffix(".weight") + ".scale"] = file
        data["weight_map"] = renamed
        index.write_text(json.dumps(data))


def convert_lora(peft_model, path: str | Path, outtype: str = "f32") -> Path:
    """Convert an in-memory PEFT LoRA model with llama.cpp's ``convert_lora_to_gguf.py``; return the path.

    The adapter (``save_pretrained``: adapter_config.json, adapter_model.safetensors) and its base
    model's config are saved to a temporary folder; the converter reads the base's config from there
    (``--base``) and writes the adapter's GGUF (``general.type = adapter``).
    """
    if not available():
        raise ConverterUnavailable(f"llama.cpp's LoRA converter is not in {source_dir()}: run "
                                   "`python -m archrun.conformance.llamacpp` to fetch it")
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir, lora_dir = Path(tmp) / "base", Path(tmp) / "lora"
        peft_model.get_base_model().config.save_pretrained(base_dir)
        peft_model.save_pretrained(lora_dir)
        args = ["--base", str(base_dir), "--outfile", str(path), "--outtype", outtype, str(lora_dir)]
        proc = subprocess.run([sys.executable, str(source_dir() / "convert_lora_to_gguf.py"), *args],
                              capture_output=True, text=True)
    if proc.returncode != 0 or not path.is_file():
        raise RuntimeError(f"llama.cpp's LoRA converter failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return path


if __name__ == "__main__":
    print(fetch_source())
