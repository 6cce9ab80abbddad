"""Fresh virtual environments for the install tests, offline.

`linked_venv(where)` makes a venv without pip whose third-party packages (numpy, numba, gguf, pytest,
...) are this environment's, linked through a .pth file (installing them would download); nothing of
archrun is installed in it. Install into it with `pip_install(python, *args)` (this environment's
pip, `--no-index --no-build-isolation`).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def linked_venv(where: Path) -> Path:
    """A new venv at `where` with this environment's third-party packages and no archrun package;
    returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = where / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("archrun", "__editable__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    (site / "deps.pth").write_text(f"{deps}\n")
    return python


def pip_install(python: Path, *args: str) -> subprocess.CompletedProcess:
    """`pip install` into the venv of `python`, offline; raises with pip's output on failure."""
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
                           "--no-build-isolation", *args], capture_output=True, text=True)
    if proc.returncode:
        raise AssertionError(f"pip install {' '.join(args)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc
