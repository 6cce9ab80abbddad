"""Level 2: traces, divergence and the recovery loop (archrun.conformance.trace_format, hf_trace,
diverge, recover, package; the `archrun trace | diverge | recover` commands).

The models are the families' tiny HF fixtures, converted by llama.cpp's converter (their committed
goldens); the HF side is rebuilt from the fixture's seed (needs torch and transformers: the
`reference` extra). An *unknown* architecture is a fixture renamed to ``mystery``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from support.venvs import linked_venv, pip_install

import archrun
from archrun.cli import main
from archrun.conformance import hf, trace_format
from archrun.conformance.diverge import compare
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.recover import recover, trace_gguf
from archrun.errors import BadTrace, NotRecovered
from archrun.io.ggufset import open_gguf
from archrun.plugins import make_plugin_manager

ROOT = Path(__file__).resolve().parents[2]
# name -> (the family's hf_arch.py folder, fixture)
CASES = {
    "llama": ("families/archrun-llama/tests/llamacpp_converted", "llama_all_biases_hd32"),
    "gemma2": ("families/archrun-gemma/tests", "gemma2_softcaps"),
    "gptneox": ("families/archrun-gptneox/tests", "gptneox_sequential_rot50"),
    "olmo2": ("families/archrun-olmo/tests", "olmo2_gqa"),
    "phi2": ("families/archrun-phi/tests", "phi2_rot50"),
    "starcoder2": ("families/archrun-starcoder2/tests", "starcoder2_bias_gqa"),
    "nemotron": ("families/archrun-nemotron/tests", "nemotron_rot50_gqa"),
    "qwen2moe": ("families/archrun-qwen2moe/tests", "qwen2moe_4experts"),
    "hunyuan": ("families/archrun-hunyuan/tests", "hunyuan_dense_gqa"),
    "smollm3": ("families/archrun-smollm3/tests", "smollm3_gqa"),
    # a key default (ALiBi's maximum bias), tensor-role remaps, three MoE conventions at once
    "bloom": ("families/archrun-bloom/tests", "bloom_4head"),
    "falcon": ("families/archrun-falcon/tests", "falcon_new_decoder_gqa"),
    "seed_oss": ("families/archrun-seed-oss/tests", "seed_oss_qkv_bias_gqa"),
    "granitemoe": ("families/archrun-granite/tests", "granitemoe_4experts"),
}


def _gguf(case: str) -> Path:
    folder, fixture = CASES[case]
    return ROOT / folder / "goldens" / f"{fixture}.gguf"


@functools.cache
def hf_reference(case: str) -> trace_format.Trace:
    """HF float32's trace of the fixture on its golden ids."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from archrun.conformance.hf_trace import trace_hf

    folder, fixture = CASES[case]
    spec = hf.load_module(ROOT / folder / "hf_arch.py")
    fx = next(f for f in spec.FIXTURES if f.name == fixture)
    model, _ = hf.build_tiny(hf.arch_of(spec.ARCHES, fx), fx.seed, **fx.overrides)
    ids = hf.load_golden(_gguf(case).with_suffix(".npz"))["ids"].astype(np.int64)
    return trace_hf(model, ids, fixture)


def renamed(case: str, tmp_path: Path) -> Path:
    """The fixture as an architecture no plugin describes."""
    return rewrite_gguf(_gguf(case), tmp_path / f"{case}_mystery.gguf", architecture="mystery")


# ------------------------------------------------------------------------------ the trace format


def test_trace_file_round_trip(tmp_path):
    ids = hf.load_golden(_gguf("llama").with_suffix(".npz"))["ids"].astype(np.int64)
    t = trace_gguf(_gguf("llama"), ids)
    assert t.aligned()[:3] == ["0/attn_out", "0/ffn_out", "0/block"]
    assert t.aligned()[-2:] == ["head/final_norm", "head/output"]
    assert "0/attention=causal" in t.ops and "head/output" in t.ops
    back = trace_format.load(trace_format.save(t, tmp_path / "t.trace"))
    assert back.names == t.names and np.array_equal(back.ids, t.ids) and np.array_equal(back.logits, t.logits)
    assert all(np.array_equal(back.ops[n], t.ops[n]) for n in t.names)
    assert compare(back, t).matches and compare(back, t).first is None


def test_bad_trace_files_are_typed(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(BadTrace, match="not a readable trace file"):
        trace_format.load(junk)
    other = tmp_path / "other.npz"
    np.savez(other, header=np.frombuffer(b'{"format": "x"}', np.uint8), ids=np.arange(3), logits=np.zeros((3, 4)))
    with pytest.raises(BadTrace, match="not an archrun-trace/1 file"):
        trace_format.load(other)
    ids = np.arange(1, 9)
    a = trace_gguf(_gguf("llama"), ids)
    b = trace_gguf(_gguf("llama"), ids[::-1].copy())
    with pytest.raises(BadTrace, match="different token ids"):
        compare(a, b)


# ------------------------------------------------------------------------------ HF alignment, diverge


def test_hf_trace_aligns_with_archrun():
    ref = hf_reference("gemma2")
    got = trace_gguf(_gguf("gemma2"), ref.ids)
    assert ref.names == got.aligned()
    report = compare(got, ref)
    assert report.matches and report.first is None, report.table()


def test_diverge_names_the_first_op_per_layer(tmp_path, capsys):
    ref = hf_reference("llama")
    path = trace_format.save(ref, tmp_path / "hf.npz")
    assert main(["diverge", str(_gguf("llama")), "--reference", str(path), "--hint", "rope_pairing=neox"]) == 0
    out = capsys.readouterr().out
    assert "first diverging op: 0/attn_out" in out
    assert main(["diverge", str(_gguf("llama")), "--reference", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["matches"] is True


# ------------------------------------------------------------------------------ recovery


@pytest.fixture(scope="module")
def recovered(tmp_path_factory):
    """case -> (the renamed file, its recovery): one search per case, shared by the backends' checks."""
    done: dict[str, tuple[Path, Any]] = {}

    def get(case: str) -> tuple[Path, Any]:
        if case not in done:
            path = renamed(case, tmp_path_factory.mktemp(case))
            with pytest.raises(archrun.ArchrunError):  # unknown conventions (or the tensors a guess would need)
                archrun.load(path, backend="reference")
            done[case] = path, recover(path, hf_reference(case), budget=120)
        return done[case]
    return get


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_recovers_an_unknown_architecture(case, backend, recovered):
    ref = hf_reference(case)
    path, found = recovered(case)
    assert found.report.logits_rel <= 1e-4, found.describe()
    json.loads(json.dumps(found.stated()))  # the hints as `--json` prints them
    model = archrun.load(path, backend=backend, hints=found.stated())
    assert hf.rel_err(model.logits(ref.ids), ref.logits) <= 1e-4, found.describe()


# convention flipped in the family's own hints -> (case, where the first divergence is)
SEEDS = {
    "rope_pairing": ("llama", "neox", "0/attn_out"),
    "activation": ("gptneox", "silu", "0/ffn_out"),
    "embed_scale": ("gemma2", 1.0, "0/ffn_out"),
    "swa_period": ("gemma2", 0, "0/attn_out"),
    "pre_norms": ("olmo2", True, "the model does not load"),
    "norm": ("starcoder2", "rms", "0/attn_out"),
    "qk_norm_after_rope": ("hunyuan", False, "0/attn_out"),
    "nope_period": ("smollm3", 0, "3/attn_out"),
    "residual": ("phi2", "sequential", "the model does not load"),  # no ffn_norm: a sequential block needs one
    "gating": ("qwen2moe", "sigmoid", "0/ffn_out"),
}


@pytest.mark.parametrize("field", list(SEEDS))
def test_a_seeded_fault_is_located_and_repaired(field):
    case, wrong, where = SEEDS[field]
    ref = hf_reference(case)
    pm = make_plugin_manager()
    family = pm.hook.archrun_describe_family(architecture=str(open_gguf(_gguf(case)).metadata["general.architecture"]))
    seeded = attrs.evolve(family, **{field: wrong})
    found = recover(_gguf(case), ref, plugins=pm, start=seeded, budget=120)
    assert found.report.matches, found.describe()
    assert found.steps[0].before == where, found.describe()
    assert getattr(found.hints, field) == getattr(family, field), found.describe()


def test_nothing_fits_is_a_typed_report():
    ref = hf_reference("llama")
    broken = dict(ref.ops)
    for name in list(broken)[list(broken).index("1/ffn_out"):]:
        broken[name] = broken[name] * 1.5  # no convention of the file makes layer 1's FFN 1.5 times larger
    ref = attrs.evolve(ref, ops=broken, logits=ref.logits * 1.5)
    with pytest.raises(NotRecovered, match=r"first diverging op is op 1/ffn_out"):
        recover(_gguf("llama"), ref, budget=20)  # stops at the op: no pair fits, or the budget ends


def test_cli_recover_writes_hints_and_a_package_that_passes(tmp_path, capsys):
    ref = trace_format.save(hf_reference("olmo2"), tmp_path / "hf.npz")
    path = renamed("olmo2", tmp_path)
    pkg = tmp_path / "pkg"
    assert main(["recover", str(path), "--reference", str(ref), "--json", "--package", str(pkg)]) == 0
    hints = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert hints["pre_norms"] is False and hints["activation"] == "silu" and hints["rope_pairing"] == "neox"
    assert (pkg / "archrun_mystery" / "__init__.py").is_file() and (pkg / "tests" / "conftest.py").is_file()
    archrun.load(path, backend="reference", hints=hints)  # the printed hints load the model
    python = fresh_venv(tmp_path / "venv", pkg)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([python, "-c", "import archrun_mystery; print(archrun_mystery.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "venv")), where  # installed, not read from the package folder
    proc = subprocess.run([python, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(pkg / "tests")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0 and " failed" not in out, out[-3000:] + proc.stderr[-2000:]
    passed = [line for line in out.splitlines() if line.startswith("PASSED ")]
    for backend in ("reference", "fast"):  # the fixture recorded from the reference, on both backends
        test = f"test_mystery_reference.py::test_matches_reference[{backend}]"
        assert any(line.endswith(test) for line in passed), out
    assert any("conftest.py::TestArchrunConformance::" in line for line in passed), out  # the kit's conftest line


def fresh_venv(where: Path, *packages: Path) -> Path:
    """A new virtual environment (no pip) with archrun's core and vocabulary plugins installed editable
    and ``packages`` installed, offline; no family plugin. Its third-party dependencies (numpy, numba,
    gguf, pytest, ...) are this environment's, linked (installing them would download). Returns its python."""
    python = linked_venv(where)
    editable = [ROOT, *sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))]
    pip_install(python, "--no-deps", *[a for p in editable for a in ("-e", str(p))], *map(str, packages))
    return python


def test_diagnose_finds_two_faults_with_the_same_engine():
    """The kit's diagnose: no single change explains two flipped conventions; the recovery loop, run
    on the reference's logits alone, finds both."""
    from archrun.conformance.diagnosis import diagnose

    golden = hf.load_golden(_gguf("llama").with_suffix(".npz"))
    why = diagnose(_gguf("llama"), golden["ids"].astype(np.int64), golden["logits"], hf.TOLERANCE,
                   hints={"rope_pairing": "neox", "activation": "gelu"}, reference_name="HF")
    assert "no single convention change makes archrun match it" in why, why
    assert "the recovery loop makes archrun match with the conventions rope_pairing='norm', activation='silu'" in why


def test_cli_trace_of_a_gguf_and_of_an_hf_directory(tmp_path, capsys):
    """`archrun trace` writes the same aligned ops for the GGUF and its HF directory (tokenized by the
    GGUF's tokenizer); `archrun recover` takes the HF directory itself as the reference."""
    pytest.importorskip("torch")
    folder, fixture = CASES["llama"]
    spec = hf.load_module(ROOT / folder / "hf_arch.py")
    fx = next(f for f in spec.FIXTURES if f.name == fixture)
    model, _ = hf.build_tiny(hf.arch_of(spec.ARCHES, fx), fx.seed, **fx.overrides)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    gguf = str(_gguf("llama"))
    assert main(["trace", gguf, "-p", "Hello there, little model.", "--out", str(tmp_path / "a.npz")]) == 0
    assert main(["trace", str(tmp_path / "hf"), "--tokenizer", gguf, "-p", "Hello there, little model.",
                 "--out", str(tmp_path / "b.npz")]) == 0
    a, b = trace_format.load(tmp_path / "a.npz"), trace_format.load(tmp_path / "b.npz")
    assert a.producer == "archrun" and b.producer == "transformers" and a.aligned() == b.names
    assert compare(a, b).matches
    path = renamed("llama", tmp_path)
    capsys.readouterr()
    assert main(["recover", str(path), "--reference", str(tmp_path / "hf"), "--json"]) == 0
    hints = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert hints["rope_pairing"] == "norm" and hints["activation"] == "silu"
    assert main(["trace", str(tmp_path / "hf"), "--out", str(tmp_path / "c.npz")]) == 1  # no --tokenizer: typed
