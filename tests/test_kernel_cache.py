"""The kernels' numba cache is emptied when a kernel source (or numba) changes (kernels._jit)."""

from __future__ import annotations

import os
import subprocess
import sys


def _import_kernels(cache_dir) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    subprocess.run([sys.executable, "-c", "import archrun.kernels"], env=env, check=True)


def test_stale_cache_files_are_removed_when_the_sources_digest_changes(tmp_path):
    _import_kernels(tmp_path)
    (stamp,) = tmp_path.rglob("archrun-kernels.stamp")
    cached = stamp.parent / "block.decode_block-1.py311.nbi"
    cached.write_bytes(b"index")
    _import_kernels(tmp_path)
    assert cached.exists()  # same sources: the cache is kept
    stamp.write_text("digest of other sources")
    _import_kernels(tmp_path)
    assert not cached.exists() and stamp.read_text() != "digest of other sources"
