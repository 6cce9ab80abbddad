"""The conformance kit's logit-bit hashes (archrun.conformance.bithash): FNV-1a over float32 bits, the
machine class they hold on, a skip with the reason elsewhere, and a failure for one changed bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from archrun import cli
from archrun.conformance import bithash
from archrun.plugins import make_plugin_manager


class Stub:
    """A model whose logits are given: position p of every path returns rows[p]."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def init_cache(self, n: int) -> list[int]:
        return [0]

    def forward_step(self, ids, cache, all_logits: bool = False) -> np.ndarray:
        start = cache[0]
        cache[0] += len(ids)
        out = self.rows[start:cache[0]]
        return out if all_logits else out[-1]


def fnv1a64(data: bytes) -> str:
    """FNV-1a 64 as published (byte by byte, Python integers)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return f"{h:016x}"


def test_fnv1a64_matches_the_published_definition():
    assert bithash.fnv1a64_rows(np.frombuffer(b"abcd", "<f4")) == ["fc179f83ee0724dd"]  # the published vector
    rows = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)
    assert bithash.fnv1a64_rows(rows) == [fnv1a64(r.astype("<f4").tobytes()) for r in rows]


def test_one_changed_bit_changes_the_hash_of_its_row_only():
    rows = np.random.default_rng(0).standard_normal((5, 33)).astype(np.float32)
    flipped = rows.copy()
    flipped.view(np.uint32)[3, 17] ^= 1  # the last mantissa bit of one logit
    a, b = bithash.fnv1a64_rows(rows), bithash.fnv1a64_rows(flipped)
    assert [i for i in range(5) if a[i] != b[i]] == [3]


def test_a_refactor_that_changes_one_output_bit_fails_naming_the_position(tmp_path):
    rows = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"model")
    recorded = bithash.entry(model_file, np.arange(6), Stub(rows))
    bithash.check_entry(recorded, model_file, Stub(rows.copy()), "synthetic/m/fast", "c")  # same bits: passes
    changed = rows.copy()
    changed.view(np.uint32)[4, 0] ^= 1
    with pytest.raises(AssertionError, match=r"synthetic/m/fast \(prefill\): the logit bits changed at positions "
                                             r"\[4\].*first: position 4"):
        bithash.check_entry(recorded, model_file, Stub(changed), "synthetic/m/fast", "c")


def test_another_input_file_is_named_as_such(tmp_path):
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"model")
    rows = np.ones((2, 3), np.float32)
    recorded = bithash.entry(model_file, np.arange(2), Stub(rows))
    model_file.write_bytes(b"other")
    with pytest.raises(AssertionError, match="the input file is not the one hashed"):
        bithash.check_entry(recorded, model_file, Stub(rows), "k", "c")


def test_machine_class_names_the_cpu_and_the_versions_the_bits_depend_on():
    cls = bithash.machine_class()
    for key in ("machine", "cpu", "cpu_simd_features", "numpy_simd", "numba", "llvmlite", "numpy", "blas", "libc"):
        assert key in cls
    assert bithash.class_id(cls) == bithash.class_id(json.loads(json.dumps(cls)))


def test_elsewhere_the_check_is_skipped_with_the_differences(tmp_path):
    here = bithash.machine_class()
    rec, why = bithash.record_for(tmp_path, here)
    assert rec is None and "no logit-bit hashes recorded" in why and "--hashes" in why
    other = {**here, "numba": "0.1.0", "cpu": "another-cpu"}
    bithash.write_record(tmp_path, {}, other)
    rec, why = bithash.record_for(tmp_path, here)
    assert rec is None and "numba" in why and "another-cpu" in why
    bithash.write_record(tmp_path, {"k": 1}, here)
    rec, why = bithash.record_for(tmp_path, here)
    assert rec["entries"] == {"k": 1} and not why


def test_every_in_repo_package_with_models_has_hashes_for_some_machine_class():
    """Every kit declaration of families/*, plugins/* and examples/* that runs a model (a synthetic variant
    or a tiny HF fixture) has logit-bit hashes recorded."""
    root = Path(__file__).resolve().parents[2]
    missing = []
    for conftest in sorted(root.glob("*/*/tests/conftest.py")):
        text = conftest.read_text()
        models = "Synthetic(" in text or any(conftest.parent.rglob("hf_arch.py"))
        if "archrun_conformance" in text and models and not bithash.read_records(conftest.parent):
            missing.append(str(conftest.parent.relative_to(root)))
    assert not missing, f"no logit-bit hashes recorded (archrun conformance record PACKAGE --hashes): {missing}"


def test_record_hashes_refuses_a_package_without_the_kit(capsys):
    assert cli.main(["conformance", "record", "no-such-plugin", "--hashes"]) != 0
    assert "no installed archrun plugin" in capsys.readouterr().err


def test_one_ulp_more_in_one_op_fails_the_recorded_hashes_of_a_family(monkeypatch):
    """The llama family's recorded hashes hold for the reference backend; nudging the output of one
    op (SwiGLU's activation in the second layer) by one ulp at one element makes them fail."""
    import archrun
    from archrun_blocks import reference

    tests = Path(__file__).resolve().parents[2] / "families/archrun-llama/tests"
    record, why = bithash.record_for(tests, bithash.machine_class())
    if record is None:
        pytest.skip(why)
    path, recorded = tests / "goldens/llama_gqa.gguf", record["entries"]["hf/llama_gqa/reference"]
    bithash.check_entry(recorded, path, archrun.load(path, backend="reference"), "hf/llama_gqa/reference", "here")
    silu, layers = reference.silu, []

    def nudged_silu():  # bound once per layer
        act, layer = silu(), len(layers)
        layers.append(layer)

        def run(x, up=None):
            out = act(x, up)
            if layer == 1:  # the second layer: its last element, one ulp up
                out = out.copy()
                out.flat[-1] = np.nextafter(out.flat[-1], np.float32(np.inf))
            return out
        return run

    monkeypatch.setattr(reference, "silu", nudged_silu)
    # a new plugin manager: the vocabulary is collected once per manager, so only a new one registers the nudged op
    nudged = archrun.load(path, backend="reference", plugins=make_plugin_manager())
    with pytest.raises(AssertionError, match="the logit bits changed at positions"):
        bithash.check_entry(recorded, path, nudged, "hf/llama_gqa/reference", "here")
