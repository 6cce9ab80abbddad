"""The standard test battery of a family package's tiny HF fixtures, as one class to subclass.

A family package keeps ``tests/hf_arch.py`` (its ``ARCHES`` and ``FIXTURES``, see
``archrun.conformance.hf``) and ``tests/goldens/`` (recorded by ``goldens/record.py``), and gets
every standard check with::

    from archrun.conformance.tiny_hf import TinyHfBattery

    class TestGpt2(TinyHfBattery):
        entry_point = "gpt2"           # the package's archrun entry point

The battery (each test parametrized over the fixtures, and the backends where it runs a model):
- ``test_family_installed``: the entry point is installed and describes every fixture's arch;
- ``test_golden_files``: the goldens folder holds exactly the fixtures, as recorded;
- ``test_matches_hf``: archrun's logits (whole prompt and token by token through the cache)
  within ``hf.TOLERANCE`` of HF float32, on both backends; a failure names the first diverging
  position and, when one convention explains it, the op and layer (``archrun.conformance.trace``);
- ``test_greedy_chain``: archrun's greedy chain from the fixture's first ids = HF float32's, recorded
  in ``goldens/greedy_chains.json``, up to the reference's first near tie (``archrun.conformance.chains``);
- ``test_llama_cpp_agrees``: llama.cpp's logits on the same file (recorded by
  ``record.py --llamacpp-check`` into ``llamacpp_check.json``, for the file's exact SHA-256)
  within ``LLAMA_CPP_TOLERANCE`` of HF's, argmax equal;
- ``test_fixture_is_sensitive``: each convention the family states for the fixture's arch,
  flipped to another vocabulary entry, moves archrun's logits by far more than the tolerance
  (or fails the load): a fixture that cannot see a convention cannot prove it;
- ``test_fixture_sees_edit``: the same for structure the file states: every bias zeroed, and the
  rotary width halved (``rope.dimension_count``), each must move the logits far beyond the tolerance;
- ``test_fixture_sees_rope_scaling`` (per layer kind, sliding and global): the rope scaling of that
  kind's layers flipped (a scaled rope made plain, a plain one given the other kind's scaling,
  ``archrun.conformance.trace.flip_rope_scaling``) must move the logits far beyond the tolerance:
  a fixture whose positions or weights cannot see a layer kind's scaling cannot prove which rope
  each kind runs (skipped where no rope of the model scales);
- ``test_memory_*`` (fixtures whose model keeps a stateful slot, ``archrun.conformance.memory``):
  chunked prefill, decode-rewind-decode, the rewind reach, checkpoints, a chat's prefix reuse
  (``PrefixCache.recomputed``), speculative decoding with rejected drafts = greedy, a batch of
  sequences each with its own state, a state that does not grow with the context;
- ``test_goldens_match_live_hf`` (marker ``live``; needs torch, transformers and llama.cpp's
  converter source): rebuilding a fixture reproduces its config, HF logits and GGUF file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from archrun.conformance import hf, memory
from archrun.conformance.checks import check_family_plugin

#: llama.cpp vs HF float32: max |Δlogit| relative to max |logit|. llama.cpp computes GELU through an
#: f16 table (its input rounded to f16), which puts GELU models at 1-2e-3 (gpt2, gemma2 measured).
LLAMA_CPP_TOLERANCE = 3e-3
#: A flipped convention must move the logits by at least this many tolerances.
SENSITIVITY = 10.0

# convention -> value -> a different vocabulary entry to flip it to
_FLIPS = {
    "rope_pairing": {"norm": "neox", "neox": "norm"},
    "activation": {"silu": "gelu_tanh", "gelu_tanh": "silu", "gelu": "silu", "relu2": "silu", "xielu": "silu"},
    "residual": {"sequential": "parallel", "parallel": "sequential"},
    "norm": {"rms": "layer", "layer": "rms", "rms_1p": "rms", "layer_1p": "layer", "rms_act8": "rms"},
}


def _here(metafunc_or_request) -> Path:
    return Path(metafunc_or_request.module.__file__).resolve().parent


def _spec(here: Path):
    return hf.load_module(here / "hf_arch.py")


def _zero_biases(path: Path, out: Path) -> Path | None:
    """A copy of the fixture with every bias tensor zeroed (None: the file has no biases)."""
    import gguf

    from archrun.conformance.gguf_edit import rewrite_gguf

    biases = {t.name: np.zeros(np.asarray(t.data).shape, np.float32)
              for t in gguf.GGUFReader(str(path)).tensors if t.name.endswith(".bias")}
    return rewrite_gguf(path, out, drop_tensors=tuple(biases), add_tensors=biases) if biases else None


def _halve_rope(path: Path, out: Path) -> Path | None:
    """A copy with half the rotary dims (None: the model has no rope, or too few dims to halve)."""
    from archrun.conformance.gguf_edit import rewrite_gguf
    from archrun.describe.compile import describe
    from archrun.descriptor import NO_ROPE

    d = describe(path)
    n_rot = max((t.n_rot for t in d.rope_tables if t.pairing != NO_ROPE), default=0)
    if n_rot < 4 or n_rot % 4:
        return None
    return rewrite_gguf(path, out, add_keys={f"{d.architecture}.rope.dimension_count": n_rot // 2})


#: Structural edits of a fixture file that archrun must see (name -> edit(path, out) -> path | None).
EDITS = {"biases_zeroed": _zero_biases, "rope_dims_halved": _halve_rope}


def assert_far_from_hf(model_path: Path, golden_path: Path, what: str, hints: Any = None) -> None:
    """Assert that the model at ``model_path`` (a changed fixture, or a fixture loaded with ``hints``), on the
    reference backend, is far from the HF golden at ``golden_path``: beyond ``SENSITIVITY`` times the
    tolerance on the golden's ids. Failing to load with a typed archrun error counts as seen (a refusal).
    ``what`` names the change in the failure message."""
    import archrun
    from archrun.errors import ArchrunError

    golden = hf.load_golden(golden_path)
    try:
        model = archrun.load(model_path, backend="reference", hints=hints)
    except ArchrunError:
        return
    err = hf.rel_err(model.logits(golden["ids"].astype(np.int64)), golden["logits"])
    assert err > SENSITIVITY * hf.TOLERANCE, (
        f"{what} moves the logits by only {err:.1e} of max |logit|: the fixture cannot see it")


def check_sees_edit(gguf_path: Path, edit: str, tmp_path: Path) -> None:
    """Apply ``EDITS[edit]`` to a copy of the fixture; assert its logits move far beyond the tolerance
    (or the copy fails to load with a typed archrun error). Skips when the edit does not apply."""
    edited = EDITS[edit](gguf_path, tmp_path / gguf_path.name)
    if edited is None:
        pytest.skip(f"{gguf_path.stem}: {edit} does not apply")
    assert_far_from_hf(edited, gguf_path.with_suffix(".npz"), f"{gguf_path.name}: {edit}")


def check_sees_rope_scaling(gguf_path: Path, kind: str) -> None:
    """Flip the rope scaling of the fixture's ``kind`` layers ("sliding" or "global"); assert the
    flipped model is far from HF: beyond ``SENSITIVITY`` times the tolerance, and as many times
    farther than the model as stated (a flip that comes closer to HF means the stated rope is the
    wrong one). A flipped model that fails with a typed archrun error counts as seen. Skips when
    nothing flips (no such layers, no rope on them, no rope of the model scales)."""
    import archrun
    from archrun.conformance.trace import build, flip_rope_scaling
    from archrun.errors import ArchrunError

    golden = hf.load_golden(gguf_path.with_suffix(".npz"))
    ids = golden["ids"].astype(np.int64)
    stated = archrun.load(gguf_path, backend="reference")
    flipped = flip_rope_scaling(stated.descriptor, kind)
    if isinstance(flipped, str):
        pytest.skip(f"{gguf_path.stem}: {flipped}")
    what, descriptor = flipped
    try:
        model = build(gguf_path, descriptor)
    except ArchrunError:
        return
    err = hf.rel_err(model.logits(ids), golden["logits"])
    base = hf.rel_err(stated.logits(ids), golden["logits"])
    if base <= hf.TOLERANCE:
        why = f"the fixture cannot tell which rope its {kind} layers run"
    elif err < base:
        why = f"the flipped rope comes closer to HF: the rope of the {kind} layers is stated wrongly"
    else:
        why = "archrun as stated is itself that far from HF: the flip is not told apart from what else differs"
    assert err > SENSITIVITY * max(hf.TOLERANCE, base), (
        f"{gguf_path.name}: with {what} archrun is {err:.1e} of max |logit| from HF, as stated {base:.1e}: {why}")


class TinyHfBattery:
    """Subclass in a family package's tests (set ``entry_point``); see the module docstring."""

    entry_point: str = ""
    #: the folder holding hf_arch.py and goldens/ (default: the test module's folder)
    folder: Path | None = None

    def _folder(self, metafunc_or_request) -> Path:
        return self.folder if self.folder is not None else _here(metafunc_or_request)

    def pytest_generate_tests(self, metafunc) -> None:
        spec = _spec(self._folder(metafunc))
        fixtures = list(spec.FIXTURES)
        if "fixture" in metafunc.fixturenames:
            metafunc.parametrize("fixture", fixtures, ids=[f.name for f in fixtures])
        if "backend" in metafunc.fixturenames:
            metafunc.parametrize("backend", hf.BACKENDS)
        if "convention" in metafunc.fixturenames:
            metafunc.parametrize("convention", sorted(_FLIPS))
        if "edit" in metafunc.fixturenames:
            metafunc.parametrize("edit", sorted(EDITS))
        if "layer_kind" in metafunc.fixturenames:
            from archrun.conformance.trace import LAYER_KINDS

            metafunc.parametrize("layer_kind", LAYER_KINDS)
        if "stateful" in metafunc.fixturenames:
            names = stateful_fixtures(self._folder(metafunc))
            metafunc.parametrize("stateful", names, ids=names)
        if "decoded" in metafunc.fixturenames:
            metafunc.parametrize("decoded", memory.DECODED)

    @pytest.fixture
    def goldens(self, request) -> Path:
        return self._folder(request) / "goldens"

    @pytest.fixture
    def spec(self, request):
        return _spec(self._folder(request))

    def test_family_installed(self, spec) -> None:
        archs = check_family_plugin(self.entry_point)
        missing = {hf.arch_of(spec.ARCHES, f).name for f in spec.FIXTURES} - set(archs)
        assert not missing, f"{self.entry_point!r} does not describe {sorted(missing)}"

    def test_golden_files(self, goldens, spec) -> None:
        hf.check_golden_files(goldens, spec.ARCHES, spec.FIXTURES)

    def test_matches_hf(self, goldens, fixture, backend) -> None:
        check_matches_hf(goldens / f"{fixture.name}.gguf", backend)

    def test_greedy_chain(self, goldens, fixture, backend) -> None:
        from archrun.conformance import chains

        path = goldens / f"{fixture.name}.gguf"
        chains.check_recorded(goldens, "hf", fixture.name, load_fixture(path, backend), path,
                              f"{fixture.name} ({backend})")

    def test_llama_cpp_agrees(self, goldens, fixture) -> None:
        if fixture.llama_cpp:
            pytest.skip(f"llama.cpp cannot run {fixture.name}: {fixture.llama_cpp}")
        check_llama_cpp_report(goldens, fixture.name)

    def test_fixture_is_sensitive(self, goldens, fixture, convention) -> None:
        check_sensitive(goldens / f"{fixture.name}.gguf", convention)

    def test_fixture_sees_edit(self, goldens, fixture, edit, tmp_path) -> None:
        check_sees_edit(goldens / f"{fixture.name}.gguf", edit, tmp_path)

    def test_fixture_sees_rope_scaling(self, goldens, fixture, layer_kind) -> None:
        check_sees_rope_scaling(goldens / f"{fixture.name}.gguf", layer_kind)

    # -- the memory battery (models with stateful slots; the plugin leaves it out when none has one) --

    def _stateful_model(self, request, name: str, backend: str):
        path = self._folder(request) / "goldens" / f"{name}.gguf"
        ids, ref = memory.golden(path)
        return load_fixture(path, backend), ids, ref

    def test_memory_chunked_prefill(self, request, stateful, backend) -> None:
        model, ids, ref = self._stateful_model(request, stateful, backend)
        memory.check_chunked_prefill(model, ids, ref, f"{stateful} ({backend})")

    def test_memory_decode_rewind_decode(self, request, stateful, backend, decoded) -> None:
        model, ids, ref = self._stateful_model(request, stateful, backend)
        memory.check_decode_rewind(model, ids, ref, f"{stateful} ({backend})", decoded)

    def test_memory_rewind_reach(self, request, stateful) -> None:
        model, ids, _ = self._stateful_model(request, stateful, "reference")
        memory.check_rewind_reach(model, ids, stateful)

    def test_memory_checkpoint(self, request, stateful, backend) -> None:
        model, ids, ref = self._stateful_model(request, stateful, backend)
        memory.check_checkpoint(model, ids, ref, f"{stateful} ({backend})")

    def test_memory_chat_reuse(self, request, stateful, backend) -> None:
        model, ids, ref = self._stateful_model(request, stateful, backend)
        memory.check_chat_reuse(model, ids, ref, f"{stateful} ({backend})")

    def test_memory_speculative_equals_greedy(self, request, stateful, backend) -> None:
        model, ids, _ = self._stateful_model(request, stateful, backend)
        memory.check_speculative(model, ids, f"{stateful} ({backend})")

    def test_memory_batch_keeps_each_state(self, request, stateful) -> None:
        model, ids, ref = self._stateful_model(request, stateful, "fast")
        memory.check_batch_spans(model, ids, ref, stateful)

    def test_memory_state_is_fixed(self, request, stateful) -> None:
        model, _, _ = self._stateful_model(request, stateful, "reference")
        memory.check_state_is_fixed(model, stateful)

    @pytest.mark.live
    def test_goldens_match_live_hf(self, goldens, spec, fixture, tmp_path) -> None:
        hf.check_live(goldens, spec.ARCHES, fixture, tmp_path)


#: the memory battery's tests (``TinyHfBattery``), left out where no fixture keeps a stateful slot
MEMORY_TESTS = ("test_memory_chunked_prefill", "test_memory_decode_rewind_decode", "test_memory_rewind_reach",
                "test_memory_checkpoint", "test_memory_chat_reuse", "test_memory_speculative_equals_greedy",
                "test_memory_batch_keeps_each_state", "test_memory_state_is_fixed")

_LOADED: dict[tuple[str, str], object] = {}


def load_fixture(path: Path, backend: str):
    """``archrun.load`` of a fixture, kept for the session (a few models at a time)."""
    import archrun

    key = (str(path), backend)
    if key not in _LOADED:
        if len(_LOADED) > 8:
            _LOADED.clear()
        _LOADED[key] = archrun.load(path, backend=backend)
    return _LOADED[key]


def stateful_fixtures(folder: Path) -> list[str]:
    """The fixtures (of ``folder/hf_arch.py``, in ``folder/goldens``) whose model keeps a stateful slot."""
    goldens = Path(folder) / "goldens"
    return [f.name for f in _spec(Path(folder)).FIXTURES
            if (goldens / f"{f.name}.gguf").is_file() and memory.is_stateful(goldens / f"{f.name}.gguf")]


def check_matches_hf(gguf_path: Path, backend: str) -> None:
    """``hf.check_fixture``; on a mismatch the message adds the diagnosis (``archrun.conformance.trace``):
    the first diverging position and, when one convention explains it, the op and layer where the
    run as stated and the corrected run first part."""
    from archrun.conformance.diagnosis import diagnose

    try:
        hf.check_fixture(gguf_path, backend)
    except AssertionError as e:
        golden = hf.load_golden(gguf_path.with_suffix(".npz"))
        why = diagnose(gguf_path, golden["ids"].astype(np.int64), golden["logits"], hf.TOLERANCE, reference_name="HF")
        raise AssertionError(f"{e}\n{why}") from None


def check_llama_cpp_report(goldens: Path, name: str, tolerance: float = LLAMA_CPP_TOLERANCE) -> None:
    """Assert ``llamacpp_check.json`` holds llama.cpp's agreement with HF for this exact fixture file."""
    report_path = goldens / "llamacpp_check.json"
    assert report_path.is_file(), f"{report_path} is missing: run goldens/record.py --llamacpp-check"
    report = json.loads(report_path.read_text())
    entry = report.get(name)
    assert entry is not None, f"{name}: not checked in llama.cpp (record.py --llamacpp-check)"
    golden = hf.load_golden(goldens / f"{name}.npz")
    assert entry.get("gguf_sha256") == golden["fixture"]["gguf_sha256"], \
        f"{name}: llama.cpp checked another file than the recorded one: re-run --llamacpp-check"
    rel = entry["max_abs_diff"] / float(np.abs(golden["logits"]).max())
    assert rel <= tolerance, f"{name}: llama.cpp is {rel:.2e} of max |logit| from HF"
    # llama.cpp may pick another token only where HF's top two are closer than their difference
    for pos in entry["argmax_mismatch_positions"]:
        top2 = np.sort(golden["logits"][pos])[-2:]
        assert top2[1] - top2[0] <= 2 * entry["max_abs_diff"], f"{name}: llama.cpp's argmax differs at {pos}"


def _stated(descriptor, convention: str):
    """The vocabulary entry ``descriptor`` uses for ``convention`` (None: the model has none)."""
    layer = descriptor.layers[0]
    if convention == "rope_pairing":
        used = {lay.attention.rope for lay in descriptor.layers if lay.attention.rope < len(descriptor.rope_tables)}
        return descriptor.rope_tables[min(used)].pairing if used else None
    if convention == "activation":  # the first block with an FFN (state-space blocks have none)
        ffns = [lay.ffn for lay in descriptor.layers if lay.ffn is not None]
        return ffns[0].activation if ffns else None
    if convention == "residual":  # topologies differ only in a block with both branches: none without one
        if descriptor.stream and _stream_caps(descriptor.stream).branches:
            return None  # the stream op runs the branches apart and carries the residual itself
        return layer.residual if any(lay.ffn is not None and not _empty(lay.attention)
                                     for lay in descriptor.layers) else None
    return descriptor.norm


def _stream_caps(name: str):
    """What the installed stream op `name` declares (archrun.contracts.OpCapabilities)."""
    from archrun.plugins import default_plugin_manager
    from archrun.vocab import build_vocabulary

    return build_vocabulary(default_plugin_manager()).entry("stream", name).op.capabilities


def _empty(attention) -> bool:
    """Whether the block's token mixer declares it adds nothing (a layer without one)."""
    from archrun.plugins import default_plugin_manager
    from archrun.vocab import build_vocabulary

    if not attention.mixer:
        return False
    return build_vocabulary(default_plugin_manager()).entry(attention.slot, attention.kind).op.capabilities.empty


def check_sensitive(gguf_path: Path, convention: str) -> None:
    """Flip one convention the fixture's model uses; assert its logits move far beyond the tolerance.

    Skips when the model does not use the convention or no entry to flip it to is known. A flip
    that makes the file fail to load (a typed archrun error) also counts as seen.
    """
    import archrun
    from archrun.errors import ArchrunError

    golden = hf.load_golden(gguf_path.with_suffix(".npz"))
    ids = golden["ids"].astype(np.int64)
    value = _stated(archrun.load(gguf_path, backend="reference").descriptor, convention)
    flipped = _FLIPS[convention].get(value)
    if flipped is None:
        pytest.skip(f"{gguf_path.stem} uses {convention}={value!r}: nothing to flip it to")
    try:
        model = archrun.load(gguf_path, backend="reference", hints={convention: flipped})
    except ArchrunError:
        return
    err = hf.rel_err(model.logits(ids), golden["logits"])
    assert err > SENSITIVITY * hf.TOLERANCE, (
        f"{gguf_path.name}: {convention} {value} -> {flipped} moves the logits by only {err:.1e} of "
        f"max |logit|: the fixture cannot tell them apart")
