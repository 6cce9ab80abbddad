"""Split GGUF models (archrun.io.ggufset): a set loads as one model, bit for bit the unsplit one, and a
broken set is a typed error naming the part.

Sets are written by gguf-py's own splitter (GGUFWriter(split_max_tensors=...), through
archrun.conformance.gguf_edit.rewrite_gguf) and, when llama.cpp's tools are built on this machine
(bench/llamacpp_tools.py), by llama.cpp's `llama-gguf-split`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from support.models import real_model

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.errors import ModelLoadError, SplitSetError
from archrun.io.ggufio import GGUFFile
from archrun.io.ggufset import GGUFSet, open_gguf

TOKENS = [1, 504, 3458, 314, 260, 1789, 28, 253, 42, 7]


def _parts(first: Path) -> list[Path]:
    return sorted(first.parent.glob(first.name.replace("-00001-of-", "-*-of-")))


@pytest.fixture(scope="module")
def smol_split(tmp_path_factory) -> Path:
    """SmolLM2-135M Q4_1 split by gguf-py into 3 parts of at most 100 tensors; the first part's path."""
    out = tmp_path_factory.mktemp("split") / "smol.gguf"
    return rewrite_gguf(real_model("smollm2"), out, split_max_tensors=100)


def _logits(path: Path, backend: str) -> np.ndarray:
    model = archrun.load(path, backend=backend)
    cache = model.init_cache(len(TOKENS))
    return model.forward_step(TOKENS, cache, all_logits=True)


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_split_model_equals_the_unsplit_one(smol_split, backend):
    parts = _parts(smol_split)
    assert [p.name for p in parts] == [f"smol-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = _logits(real_model("smollm2"), backend)
    split = _logits(parts[1], backend)  # any part's path loads the set
    assert np.array_equal(whole.view(np.uint32), split.view(np.uint32))


def test_inspect_shows_the_parts(smol_split):
    from archrun.describe.inspect import inspect_model, render_text

    info = inspect_model(_parts(smol_split)[2])
    assert [p["file"] for p in info["parts"]] == [p.name for p in _parts(smol_split)]
    assert sum(p["tensors"] for p in info["parts"]) == info["tensors"] == 272
    assert "part 3/3      smol-00003-of-00003.gguf" in render_text(info)


def _llama_gguf_split() -> Path | None:
    root = os.environ.get("ARCHRUN_LLAMACPP_TOOLS")
    from archrun.conformance.llamacpp import LLAMA_CPP_PYTHON

    base = Path(root) if root else Path.home() / ".cache" / "archrun" / "llama.cpp" / f"{LLAMA_CPP_PYTHON}-tools"
    tool = base / "build" / "bin" / "llama-gguf-split"
    return tool if tool.is_file() else None


def test_llama_cpp_split_loads_bit_for_bit(tmp_path):
    tool = _llama_gguf_split()
    if tool is None:
        pytest.skip("llama.cpp's llama-gguf-split is not built here (bench/llamacpp_tools.py)")
    src = real_model("smollm2")
    subprocess.run([str(tool), "--split", "--split-max-tensors", "120", str(src), str(tmp_path / "smol")],
                   check=True, capture_output=True)
    parts = sorted(tmp_path.glob("smol-*-of-*.gguf"))
    assert len(parts) == 3
    assert np.array_equal(_logits(src, "fast"), _logits(parts[-1], "fast"))


# ---- broken sets (a small synthetic model) -----------------------------------------------------

@pytest.fixture
def synth_split(synth_model, tmp_path):
    """Factory: a synthetic model split into parts of at most `per_part` tensors; the parts' paths."""
    def make(name: str = "m", per_part: int = 8, **kw) -> list[Path]:
        first = rewrite_gguf(synth_model(**kw), tmp_path / f"{name}.gguf", split_max_tensors=per_part)
        return _parts(first)

    return make


def test_a_split_synthetic_model_runs(synth_split, synth_model):
    parts = synth_split()
    with open_gguf(parts[0]) as g:
        assert isinstance(g, GGUFSet) and len(g.parts) == len(parts) >= 3
        assert g.paths == tuple(parts)
    whole, split = (archrun.load(p, backend="reference") for p in (synth_model(), parts[-1]))
    a = whole.forward_step([1, 2, 3], whole.init_cache(4))
    assert np.array_equal(a, split.forward_step([1, 2, 3], split.init_cache(4)))


def test_missing_part(synth_split):
    parts = synth_split()
    parts[1].unlink()
    with pytest.raises(SplitSetError, match=rf"part 2 of {len(parts)} .* is missing"):
        archrun.load(parts[0])


def test_part_of_another_set(synth_split):
    ours = synth_split("a")
    other = synth_split("b", per_part=15)  # the same model in 2 parts
    shutil.copy(other[1], ours[1])
    with pytest.raises(SplitSetError, match=r"says it is part 2 of 2, not part 2 of \d+: it belongs to another set"):
        open_gguf(ours[0])


def test_part_of_a_bigger_model(synth_split):
    ours = synth_split("a", n_layer=2)
    other = synth_split("b", n_layer=3, per_part=10)
    assert len(ours) == len(other)
    shutil.copy(other[1], ours[1])
    with pytest.raises(SplitSetError, match="split.tensors.count .* belong to different sets"):
        open_gguf(ours[0])


def test_tensor_count_mismatch(synth_split, tmp_path):
    parts = synth_split()
    with open_gguf(parts[0]) as g:
        n = len(g.tensors)
    for p in parts:  # every part claims one tensor more than the set holds
        _set_tensor_count(p, n + 1)
    with pytest.raises(SplitSetError, match=rf"split.tensors.count = {n + 1} but the {len(parts)} parts hold {n}"):
        open_gguf(parts[1])


def _set_tensor_count(path: Path, n: int) -> None:
    """Rewrite the i32 value of split.tensors.count in place (same size: the rest of the file is unchanged)."""
    r = gguf.GGUFReader(str(path))
    field = r.fields["split.tensors.count"]
    offset = int(field.parts[field.data[0]].__array_interface__["data"][0] - r.data.__array_interface__["data"][0])
    del r
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.int32(n).tobytes())


def test_duplicate_tensor_across_parts(tmp_path):
    for no in range(2):
        w = gguf.GGUFWriter(tmp_path / f"d-0000{no + 1}-of-00002.gguf", "llama")
        if no:
            w.kv_data[0].pop("general.architecture")
        w.add_uint16("split.no", no)
        w.add_uint16("split.count", 2)
        w.add_int32("split.tensors.count", 2)
        w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    with pytest.raises(SplitSetError, match="'token_embd.weight' is in both d-00001-of-00002.gguf and d-00002"):
        open_gguf(tmp_path / "d-00002-of-00002.gguf")


def test_truncated_part(synth_split):
    parts = synth_split()
    size = parts[-1].stat().st_size
    os.truncate(parts[-1], size - 100)
    with pytest.raises(ModelLoadError, match=rf"part {len(parts)} of {len(parts)}: .*runs past the end"):
        archrun.load(parts[0])


def test_a_renamed_part_cannot_find_the_others(synth_split):
    parts = synth_split()
    renamed = parts[0].with_name("model.gguf")
    parts[0].rename(renamed)
    with pytest.raises(SplitSetError, match=r"its name does not say so \(<prefix>-00001-of-"):
        open_gguf(renamed)


def test_one_part_sets_are_plain_files(synth_model, tmp_path):
    path = rewrite_gguf(synth_model(), tmp_path / "one.gguf", add_keys={"split.count": 1, "split.no": 0})
    with open_gguf(path) as g:
        assert isinstance(g, GGUFFile)
