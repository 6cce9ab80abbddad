"""llama.cpp's own benchmark tools, built once from the llama.cpp source llama-cpp-python vendors.

The benchmarks compare archrun with llama.cpp measured in the same run. llama-cpp-python's Python
API covers one sequence at a time; llama.cpp's batched throughput and its decode at a depth come
from its own tools, `llama-batched-bench` and `llama-bench`, built here from the same source the
reference venv's llama-cpp-python was compiled from: its PyPI sdist (version
archrun.conformance.llamacpp.LLAMA_CPP_PYTHON), downloaded with pip.

Built with -march=native (GGML_NATIVE) but without AMX (-mno-amx-*): its tile code faults in the
virtual machines this project is measured on. CPU only, no curl, no tests/examples/server. The
build (~10 minutes on 2 cores) lands in ~/.cache/archrun/llama.cpp/<version>-tools/ (or
$ARCHRUN_LLAMACPP_TOOLS) and is reused while the source version is the same.

    python bench/llamacpp_tools.py            # build (once) and print the tools' paths
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from archrun.conformance.llamacpp import LLAMA_CPP_PYTHON

TOOLS = ("llama-bench", "llama-batched-bench", "llama-gguf-split")  # the last: tests/io/test_ggufset.py
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
_SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"


def tools_dir() -> Path:
    """Where the built tools live."""
    env = os.environ.get("ARCHRUN_LLAMACPP_TOOLS")
    return Path(env) if env else Path.home() / ".cache" / "archrun" / "llama.cpp" / f"{LLAMA_CPP_PYTHON}-tools"


def tool(name: str) -> Path | None:
    """The path of a built tool, or None when it is not built yet."""
    path = tools_dir() / "build" / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _source(into: Path) -> Path:
    """llama.cpp's source tree from llama-cpp-python's sdist, extracted under `into`."""
    src = into / _SDIST / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
        with tarfile.open(Path(tmp) / f"{_SDIST}.tar.gz") as tar:
            tar.extractall(into, filter="data")
    return src


def build(jobs: int | None = None) -> dict[str, Path]:
    """Build the TOOLS if needed; {name: path}."""
    if all(tool(t) for t in TOOLS):
        return {t: tool(t) for t in TOOLS}
    root = tools_dir()
    root.mkdir(parents=True, exist_ok=True)
    src, out = _source(root), root / "build"
    flags = [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF", *flags], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(out), "-j", str(jobs or os.cpu_count() or 2), "--target", *TOOLS],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(root / _SDIST, ignore_errors=True)  # the build keeps what it needs
    missing = [t for t in TOOLS if not tool(t)]
    if missing:
        raise RuntimeError(f"llama.cpp build finished without {missing} in {out / 'bin'}")
    return {t: tool(t) for t in TOOLS}


if __name__ == "__main__":
    for name, path in build().items():
        print(f"{name}: {path}")
