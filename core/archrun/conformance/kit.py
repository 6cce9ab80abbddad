"""The standard conformance battery of a plugin package, generated from what it registers and declares.

A package declares itself in its tests' ``conftest.py`` (see ``archrun.conformance.pytest_plugin``)::

    archrun_conformance = "myfamily"                      # its archrun entry point

or, with synthetic variants and an independent reference forward pass::

    from archrun.conformance import Conformance, Synthetic
    archrun_conformance = Conformance("myfamily", synthetic=[Synthetic("dense", "myarch"), ...],
                                      reference=my_numpy_forward)

and gets ``ConformanceKit``'s tests (each parametrized over the variants, backends, corruptions
or ops it applies to), plus ``TinyHfBattery``'s when the folder holds ``hf_arch.py`` and
``goldens/``. Model-free: the synthetic GGUF files are written into a temporary folder.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from archrun.conformance import synthetic as synth
from archrun.conformance.synthetic import Synthetic

#: archrun vs itself (paths, backends, fused vs op by op), float32 weights: max |Δ| / max |logit|
TOLERANCE = 1e-4
N_IDS = 12


@attrs.frozen
class Conformance:
    """What a package declares to the kit.

    ``entry_point``: its archrun entry-point name. ``synthetic``: the model variants to write
    (default: one standard dense model per architecture the package describes; ``()``: none, for a
    structure the writer cannot express — the tiny HF fixtures then carry the models). ``reference``:
    an independent forward pass ``reference(path, ids) -> logits [n, vocab]`` (numpy, reading the
    file without archrun), checked on every variant. ``op_specs``: ``"slot=name"`` -> the factory
    specs the fast-op check drives that op on (``AttentionSpec``s of an attention op with its own
    layout). ``op_deviations``: ``"slot=name"`` -> {input-case pattern: why}: cases where the fast
    op is known to differ from its reference (each must still differ; ``archrun.conformance.ops``).
    ``op_drivers``: ``"slot=name"`` -> ``driver(label, reference_factory, fast_factory)``: the cases of an
    op whose calls take inputs the slot's harness does not build (an attention op's side inputs, a table
    it binds at load); the driver builds both ops, runs them on its cases and compares each with
    ``archrun.conformance.ops.close``.
    """

    entry_point: str
    synthetic: Sequence[Synthetic] | None = attrs.field(default=None, converter=attrs.converters.optional(tuple))
    reference: Callable[[Path, np.ndarray], np.ndarray] | None = None
    op_specs: Mapping[str, Sequence[Any]] = attrs.field(factory=dict)
    op_deviations: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)
    op_drivers: Mapping[str, Callable[[str, Callable, Callable], None]] = attrs.field(factory=dict)
    op_by_op: str = ""

    @classmethod
    def of(cls, value: Any) -> Conformance:
        if isinstance(value, Conformance):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"archrun_conformance must be an entry-point name or a Conformance, got {value!r}")


def _plugin_manager(entry_point: str):
    from archrun.plugins import installed_plugins, make_plugin_manager

    assert entry_point in installed_plugins(), f"no archrun entry point named {entry_point!r} is installed"
    return make_plugin_manager()


def described(entry_point: str) -> list[str]:
    """The architectures the package describes (empty for a vocabulary-only package)."""
    from archrun.plugins import make_plugin_manager

    pm = make_plugin_manager(names=[entry_point])
    return [a for lst in pm.hook.archrun_families() for a in lst]


def own_ops(entry_point: str) -> list[Any]:
    """The vocabulary entries the package registers."""
    from archrun.plugins import make_plugin_manager
    from archrun.vocab import build_vocabulary

    return [e for e in build_vocabulary(make_plugin_manager(names=[entry_point])) if e.plugin == entry_point]


def variants(decl: Conformance) -> list[Synthetic]:
    if decl.synthetic is not None:
        return list(decl.synthetic)
    return [Synthetic(arch, arch) for arch in described(decl.entry_point)]


def hints_of(arch: str) -> Any:
    from archrun.plugins import default_plugin_manager

    return default_plugin_manager().hook.archrun_describe_family(architecture=arch)


def ids_of(spec: Synthetic, n: int = N_IDS) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(spec.name.encode()))
    return rng.integers(0, spec.n_vocab, size=n).astype(np.int64)


# ------------------------------------------------------------------------------ descriptor JSON


def descriptor_from_dict(data: dict[str, Any]):
    """Rebuild a Descriptor from ``Descriptor.to_dict()`` (after a JSON round trip)."""
    from archrun.descriptor import AttentionSpec, Descriptor, FfnSpec, LayerSpec, MoeSpec, RopeSpec

    def layer(ly: dict[str, Any]) -> LayerSpec:
        ffn = ly["ffn"]
        ffn_cls = MoeSpec if "n_expert" in ffn else FfnSpec
        return LayerSpec(**{**ly, "attention": AttentionSpec(**ly["attention"]), "ffn": ffn_cls(**ffn)})

    return Descriptor(**{**data, "layers": [layer(ly) for ly in data["layers"]],
                         "nextn_layers": [layer(ly) for ly in data["nextn_layers"]],
                         "rope_tables": [RopeSpec(**r) for r in data["rope_tables"]]})


# ------------------------------------------------------------------------------ checks


def _diff_message(what: str, got: np.ndarray, want: np.ndarray, tolerance: float = TOLERANCE) -> str | None:
    from archrun.conformance.trace import first_diff

    found = first_diff(got, want, tolerance)
    if found is None:
        return None
    p, element = found
    err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    return (f"{what}: first diverging position {p} (element {list(element)}: {got[element]:.6g} vs "
            f"{want[element]:.6g}); max |Δ| {err:.2e} of max |logit| > {tolerance:g}")


def check_paths_agree(model: Any, ids: np.ndarray, name: str) -> None:
    """No-cache logits = cached prefill = token by token through the cache."""
    whole = model.logits(ids)
    cache = model.init_cache(len(ids))
    prefill = model.forward_step(ids, cache, all_logits=True)
    cache = model.init_cache(len(ids))
    steps = np.stack([model.forward_step([t], cache) for t in ids])
    for what, got in (("cached prefill vs no-cache logits", prefill), ("token by token vs no-cache logits", steps)):
        msg = _diff_message(f"{name}: {what}", got, whole)
        assert msg is None, msg


def check_rewind(model: Any, ids: np.ndarray, name: str) -> None:
    """Prefill, rewind k tokens, decode others: equals a fresh run of the kept prefix plus the others."""
    n, k = len(ids), len(ids) // 3
    other = (ids[-k:][::-1] + 1) % model.descriptor.n_vocab
    cache = model.init_cache(n + 4)
    model.forward_step(ids, cache, all_logits=True)
    cache.rewind(k)
    assert len(cache) == n - k
    got = np.stack([model.forward_step([t], cache) for t in other])
    fresh = model.logits(np.concatenate([ids[: n - k], other]))[n - k:]
    msg = _diff_message(f"{name}: after rewinding {k} tokens, re-decoded logits vs a fresh run "
                        f"(position counted from the rewind point)", got, fresh)
    assert msg is None, msg


def check_batch(model: Any, ids: np.ndarray, name: str) -> None:
    """forward_step_batch of two sequences = each sequence alone."""
    a, b = ids[:5], ids[5:9][::-1].copy()
    single = []
    for seq in (a, b):
        cache = model.init_cache(len(ids))
        model.forward_step(seq[:-1], cache)
        single.append(model.forward_step(seq[-1:], cache))
    caches = [model.init_cache(len(ids)) for _ in range(2)]
    for seq, cache in zip((a, b), caches, strict=True):
        model.forward_step(seq[:-1], cache)
    batched = model.forward_step_batch([a[-1:], b[-1:]], caches)
    for i in range(2):
        msg = _diff_message(f"{name}: sequence {i} of a batch vs alone", batched[i][None], single[i][None])
        assert msg is None, msg


def check_fused(model: Any, ids: np.ndarray, name: str) -> None:
    """Fused one-call-per-layer decode = op-by-op decode, token by token (fast backend)."""
    if model.fused_blocks is None:
        missing = _ops_without_part(model)
        raise AssertionError(f"{name}: the model does not decode fused on the fast backend; ops without a "
                             f"kernel part: {', '.join(missing) or 'none found (the layer kernel refused the model)'}")
    cache = model.init_cache(len(ids))
    fused = np.stack([model.forward_step([t], cache) for t in ids])
    blocks = model.fused_blocks
    try:
        model.fused_blocks = None  # the op-by-op path for one-token steps too
        cache = model.init_cache(len(ids))
        op_by_op = np.stack([model.forward_step([t], cache) for t in ids])
    finally:
        model.fused_blocks = blocks
    msg = _diff_message(f"{name}: fused decode vs op-by-op decode", fused, op_by_op)
    assert msg is None, msg


def _ops_without_part(model: Any) -> list[str]:
    from archrun.kernels.decode.fusion import dense_activation, fused_part
    from archrun.run.plan import DenseFfn

    declared = model.plan.binder.declared
    out = []
    for i, lp in enumerate(model.plan.layers):
        ffn = lp.ffn
        checks = [(lp.spec.attention.slot, lp.attention, f"{lp.spec.attention.slot}={lp.spec.attention.kind}"),
                  ("residual", lp.residual, f"residual={lp.spec.residual}")]
        if isinstance(ffn, DenseFfn):  # a part of either kind (a gated one in a gated FFN)
            checks.append(("activation", ffn, f"activation={lp.spec.ffn.activation}"))
        for slot, op, label in checks:
            try:
                if slot == "activation":
                    has = dense_activation(op, declared(op.act)) is not None
                else:
                    has = fused_part(op, declared(op), slot) is not None
            except Exception:  # noqa: BLE001 (a malformed part is "no part" here)
                has = False
            if not has:
                out.append(f"{label} (layer {i})")
    return out


def check_backends_agree(fast: Any, reference: Any, ids: np.ndarray, name: str) -> None:
    msg = _diff_message(f"{name}: fast backend vs reference backend", fast.logits(ids), reference.logits(ids))
    assert msg is None, msg


def check_descriptor(path: Path, name: str) -> None:
    """The file compiles; its descriptor survives a JSON round trip unchanged."""
    from archrun.describe.compile import describe

    d = describe(path)
    text = json.dumps(d.to_dict())
    back = descriptor_from_dict(json.loads(text))
    assert back == d, f"{name}: the descriptor changes through JSON: {d} vs {back}"


def check_inspect(path: Path, entry_point: str, name: str) -> None:
    """`archrun inspect` (its JSON and its text: archrun.describe.inspect, which the command prints) names the
    family, every op's provider (all installed), the descriptor."""
    from archrun.describe.compile import describe
    from archrun.describe.inspect import inspect_model, render_text

    info = json.loads(json.dumps(inspect_model(path)))  # what `archrun inspect --json` prints
    d = describe(path)
    assert info["architecture"] == d.architecture
    assert info["descriptor"] == json.loads(json.dumps(d.to_dict())), f"{name}: inspect shows another descriptor"
    missing = [op for op, plugin in info["providers"].items() if plugin is None]
    assert not missing, f"{name}: archrun inspect finds no provider for {missing}"
    text = render_text(inspect_model(path))
    for op, plugin in info["providers"].items():
        assert op in text and plugin in text, f"{name}: text inspect omits {op} ({plugin})"


def check_bad_input(make: Callable[[Path], Path], errors: tuple[type, ...], dst: Path, name: str) -> None:
    """Loading the corrupted file raises one of ``errors`` (typed archrun errors), nothing else."""
    import warnings

    import archrun
    from archrun.errors import ArchrunError

    path = make(dst)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            archrun.load(path, backend="reference")
        except errors:
            return
        except ArchrunError as e:
            raise AssertionError(f"{name}: raised {type(e).__name__} ({e}); expected "
                                 f"{' or '.join(t.__name__ for t in errors)}") from e
        except Exception as e:  # noqa: BLE001 (the point: anything untyped is a failure)
            raise AssertionError(f"{name}: raised an untyped {type(e).__name__}: {e}") from e
    raise AssertionError(f"{name}: the corrupted file loaded without an error")


def check_reference(path: Path, ids: np.ndarray, reference: Callable, backend: str, name: str,
                    tolerance: float = TOLERANCE) -> None:
    """archrun's logits equal the package's independent forward pass; on failure, diagnose."""
    import archrun
    from archrun.conformance.diagnosis import diagnose

    want = np.asarray(reference(path, ids), dtype=np.float64)
    got = archrun.load(path, backend=backend).logits(ids)
    msg = _diff_message(f"{name} ({backend}): logits vs the package's reference forward pass", got, want, tolerance)
    if msg is not None:
        raise AssertionError(msg + "\n" + diagnose(path, ids, want, tolerance, reference_name="the reference"))


# ------------------------------------------------------------------------------ the test class


def synthetic_path(decl: Conformance, variant: Synthetic, tmp_path_factory) -> Path:
    """The variant's GGUF file, written once per session."""
    key = (decl.entry_point, variant.name)
    if key not in ConformanceKit._files:
        folder = tmp_path_factory.mktemp(f"conformance-{variant.name}")
        ConformanceKit._files[key] = synth.write(folder / f"{variant.name}.gguf", variant, hints_of(variant.arch))
    return ConformanceKit._files[key]


def load_cached(path: Path, backend: str, block_style: str | None = None) -> Any:
    """``archrun.load``, kept for the session (a few models at a time)."""
    import archrun

    key = (str(path), backend, block_style or "")
    if key not in ConformanceKit._models:
        if len(ConformanceKit._models) > 16:
            ConformanceKit._models.clear()
        ConformanceKit._models[key] = archrun.load(path, backend=backend, block_style=block_style)
    return ConformanceKit._models[key]


class ConformanceKit:
    """The model-free battery; the pytest plugin builds a subclass per declaring package."""

    declaration: Conformance
    here: Path

    _files: dict[tuple[str, str], Path] = {}
    _models: dict[tuple[str, str, str], Any] = {}

    def pytest_generate_tests(self, metafunc) -> None:
        decl = self.declaration
        specs = variants(decl)
        if "variant" in metafunc.fixturenames:
            metafunc.parametrize("variant", specs, ids=[s.name for s in specs])
        if "backend" in metafunc.fixturenames:
            metafunc.parametrize("backend", ["reference", "fast"])
        if "corruption" in metafunc.fixturenames:
            metafunc.parametrize("corruption", synth.CORRUPTIONS)
        if "op_entry" in metafunc.fixturenames:
            ops = [e for e in own_ops(decl.entry_point) if e.op.fast is not None]
            metafunc.parametrize("op_entry", ops, ids=[f"{e.op.slot}={e.op.name}" for e in ops])

    # -- fixtures ----------------------------------------------------------------------------

    @pytest.fixture
    def path(self, variant, tmp_path_factory) -> Path:
        return synthetic_path(self.declaration, variant, tmp_path_factory)

    def model(self, path: Path, backend: str, block_style: str | None = None) -> Any:
        return load_cached(path, backend, block_style)

    # -- registration ----------------------------------------------------------------------------

    def test_registers(self) -> None:
        from archrun.conformance.checks import check_family_plugin

        ep = self.declaration.entry_point
        _plugin_manager(ep)
        archs, ops = described(ep), own_ops(ep)
        assert archs or ops, f"{ep!r} registers neither a family nor vocabulary"
        if archs:
            check_family_plugin(ep)
        wanted = {s.arch for s in variants(self.declaration)}
        assert wanted <= set(archs) | _all_described(), f"no installed family describes {sorted(wanted)}"

    # -- descriptor --------------------------------------------------------------------------------

    def test_descriptor_json_round_trip(self, variant, path) -> None:
        check_descriptor(path, variant.name)

    def test_inspect(self, variant, path) -> None:
        check_inspect(path, self.declaration.entry_point, variant.name)

    # -- decoding paths ----------------------------------------------------------------------------

    def test_cache_paths_agree(self, variant, path, backend) -> None:
        check_paths_agree(self.model(path, backend), ids_of(variant), f"{variant.name} ({backend})")

    def test_rewind_and_redecode(self, variant, path, backend) -> None:
        check_rewind(self.model(path, backend), ids_of(variant), f"{variant.name} ({backend})")

    def test_backends_agree(self, variant, path) -> None:
        ids = ids_of(variant)
        check_backends_agree(self.model(path, "fast"), self.model(path, "reference"), ids, variant.name)

    def test_batch_equals_single(self, variant, path) -> None:
        model = self.model(path, "fast", "fused")
        check_batch(model, ids_of(variant), variant.name)

    def test_fused_decode_equals_op_by_op(self, variant, path) -> None:
        model = self.model(path, "fast", "fused")
        if self.declaration.op_by_op:
            assert model.fused_blocks is None, (f"{variant.name} decodes fused: remove the declaration op_by_op="
                                                f"{self.declaration.op_by_op!r}")
            pytest.skip(f"{variant.name} decodes op by op, as declared: {self.declaration.op_by_op}")
        check_fused(model, ids_of(variant), variant.name)

    def test_block_style_guards(self, variant, path) -> None:
        from archrun.errors import WrongBlockStyle

        ids = ids_of(variant)[:3]
        host = self.model(path, "fast", "host_reference")
        with pytest.raises(WrongBlockStyle):
            host.forward_step_batch([ids], [host.init_cache(8)])
        fused = self.model(path, "fast", "fused")
        with pytest.raises(WrongBlockStyle):
            fused.host_step(ids, fused.init_cache(8))
        msg = _diff_message(f"{variant.name}: host_reference vs fused logits", host.logits(ids), fused.logits(ids))
        assert msg is None, msg

    # -- ops ---------------------------------------------------------------------------------------

    def test_fast_op_equals_reference(self, op_entry) -> None:
        from archrun.conformance.ops import Unsupported, check_fast_op

        key = f"{op_entry.op.slot}={op_entry.op.name}"
        decl = self.declaration
        try:
            check_fast_op(op_entry, decl.op_deviations.get(key), decl.op_specs.get(key, ()), decl.op_drivers.get(key))
        except Unsupported as e:
            pytest.skip(str(e))

    # -- bad inputs --------------------------------------------------------------------------------

    def test_bad_input(self, variant, corruption, tmp_path) -> None:
        make, errors = synth.corruptions(variant, hints_of(variant.arch))[corruption]
        check_bad_input(make, errors, tmp_path / f"{corruption}.gguf", f"{variant.name}/{corruption}")

    # -- an independent reference --------------------------------------------------------------------

    def test_matches_reference(self, variant, path, backend) -> None:
        if self.declaration.reference is None:
            pytest.skip("the package declares no independent reference forward pass (Conformance.reference)")
        check_reference(path, ids_of(variant, 16), self.declaration.reference, backend, variant.name)

    def test_greedy_chain(self, variant, path, backend) -> None:
        """archrun's greedy chain = the declared reference's, recorded in ``goldens/greedy_chains.json``."""
        from archrun.conformance import chains

        if self.declaration.reference is None:
            pytest.skip("the package declares no independent reference forward pass (Conformance.reference)")
        chains.check_recorded(self.here / "goldens", "synthetic", variant.name, self.model(path, backend), path,
                              f"{variant.name} ({backend})")


# ------------------------------------------------------------------------------ logit-bit hashes


@attrs.frozen
class HashedModel:
    """One model whose logit bits the package pins: a synthetic variant or a tiny HF fixture."""

    source: str  # "synthetic" | "hf"
    name: str
    variant: Synthetic | None = None
    gguf: Path | None = None

    def ids(self) -> np.ndarray:
        if self.variant is not None:
            return ids_of(self.variant)
        from archrun.conformance import hf

        return hf.load_golden(self.gguf.with_suffix(".npz"))["ids"].astype(np.int64)


def hashed_models(decl: Conformance, here: Path) -> list[HashedModel]:
    """The package's synthetic variants, then the fixtures of every ``hf_arch.py`` under ``here``
    with a ``goldens/`` folder beside it."""
    from archrun.conformance import hf

    out = [HashedModel("synthetic", v.name, variant=v) for v in variants(decl)]
    for spec_path in sorted(Path(here).rglob("hf_arch.py")):
        goldens = spec_path.parent / "goldens"
        if goldens.is_dir():
            out += [HashedModel("hf", f.name, gguf=goldens / f"{f.name}.gguf")
                    for f in hf.load_module(spec_path).FIXTURES]
    return out


def declarations(entry_point: str) -> list[tuple[Conformance, Path]]:
    """The kit declarations (``conftest.py`` files with ``archrun_conformance``) of an installed package."""
    import sys

    from archrun.conformance import hf
    from archrun.errors import InvalidRequest

    tests = hf.package_root(entry_point) / "tests"
    out = []
    for conftest in sorted(tests.rglob("conftest.py")) if tests.is_dir() else []:
        if "archrun_conformance" not in conftest.read_text():
            continue
        sys.path.insert(0, str(conftest.parent))  # a conftest may import its folder's helpers
        try:
            module = hf.load_module(conftest)
        finally:
            sys.path.remove(str(conftest.parent))
        if hasattr(module, "archrun_conformance"):
            out.append((Conformance.of(module.archrun_conformance), conftest.parent))
    if not out:
        raise InvalidRequest(f"plugin {entry_point!r} does not use the conformance kit: no tests/**/conftest.py "
                             "declares archrun_conformance (see docs/conformance.md)")
    return out


def record_package_hashes(entry_point: str) -> list[Path]:
    """``archrun conformance record PACKAGE --hashes``: record the logit bits of every model of each kit
    declaration of the package, for this machine class; return the files written."""
    import tempfile

    written = []
    with tempfile.TemporaryDirectory() as work:
        for decl, here in declarations(entry_point):
            written.append(record_hashes(decl, here, Path(work)))
    return written


def record_package_reference_chains(entry_point: str) -> list[Path]:
    """The greedy chains of every kit declaration of the package that declares an independent reference
    (``record_reference_chains``); return the files written."""
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        found = [record_reference_chains(decl, here, Path(work)) for decl, here in declarations(entry_point)]
    return [p for p in found if p is not None]


def record_hashes(decl: Conformance, here: Path, work: Path) -> Path:
    """Hash every model of the package on both backends into ``here/logit_hashes/<machine class>.json``.

    Each model is checked first (fast = reference backend; HF fixtures against their goldens; a
    declared reference forward pass): the hashes pin an output the correctness checks accept.
    """
    import archrun
    from archrun.conformance import bithash
    from archrun.errors import InvalidRequest

    entries = {}
    for m in hashed_models(decl, here):
        path = m.gguf if m.variant is None else synth.write(work / f"{m.name}.gguf", m.variant,
                                                            hints_of(m.variant.arch))
        ids = m.ids()
        models = {b: archrun.load(path, backend=b) for b in ("reference", "fast")}
        try:
            _check_before_hashing(m, path, ids, models, decl)
        except AssertionError as e:
            raise InvalidRequest(f"not recording logit-bit hashes of an output the checks refuse: {e}") from None
        for backend, model in models.items():
            entries[bithash.key(m.source, m.name, backend)] = bithash.entry(path, ids, model)
        print(f"hashed {m.source}/{m.name}")
    return bithash.write_record(here, entries)


def _check_before_hashing(m: HashedModel, path: Path, ids: np.ndarray, models: dict[str, Any],
                          decl: Conformance) -> None:
    from archrun.conformance import hf

    check_backends_agree(models["fast"], models["reference"], ids, m.name)
    if m.source == "hf":
        want = hf.load_golden(path.with_suffix(".npz"))["logits"]
        msg = _diff_message(f"{m.name}: logits vs the HF golden", models["reference"].logits(ids), want, hf.TOLERANCE)
        assert msg is None, msg
    elif decl.reference is not None:
        check_reference(path, ids, decl.reference, "reference", m.name)


class BitHashes:
    """Logit-bit regression pins (``archrun.conformance.bithash``); the plugin builds a subclass per package."""

    declaration: Conformance
    here: Path

    def pytest_generate_tests(self, metafunc) -> None:
        models = hashed_models(self.declaration, self.here)
        metafunc.parametrize("hashed", models, ids=[f"{m.source}-{m.name}" for m in models])
        metafunc.parametrize("backend", ["reference", "fast"])

    def test_logit_bits(self, hashed, backend, tmp_path_factory) -> None:
        from archrun.conformance import bithash

        cls = _machine_class()
        record, why = bithash.record_for(self.here, cls)
        if record is None:
            pytest.skip(why)
        k = bithash.key(hashed.source, hashed.name, backend)
        if k not in record["entries"]:
            pytest.skip(f"{k} is not in this machine class's record (added after it was recorded): re-record with "
                        "archrun conformance record PACKAGE --hashes")
        if hashed.gguf is not None:
            import archrun

            path, model = hashed.gguf, archrun.load(hashed.gguf, backend=backend)
        else:
            path = synthetic_path(self.declaration, hashed.variant, tmp_path_factory)
            model = load_cached(path, backend)
        bithash.check_entry(record["entries"][k], path, model, k, record["class_id"])


_MACHINE: list[dict[str, Any]] = []


def _machine_class() -> dict[str, Any]:
    from archrun.conformance import bithash

    if not _MACHINE:
        _MACHINE.append(bithash.machine_class())
    return _MACHINE[0]


def _all_described() -> set[str]:
    from archrun.plugins import default_plugin_manager

    return {a for lst in default_plugin_manager().hook.archrun_families() for a in lst}


def record_reference_chains(decl: Any, here: Path, work: Path) -> Path | None:
    """Greedy chains of a package's declared independent forward pass on its synthetic variants
    (``Conformance.reference``) into ``here/goldens``; None when it declares none. Refuses a variant
    on which archrun's logits are off the reference (``check_reference``)."""
    import platform

    from archrun.conformance import bithash, chains
    from archrun.errors import InvalidRequest

    if decl.reference is None:
        return None
    vers = {"python": platform.python_version(), "numpy": np.__version__,
            "reference": f"{getattr(decl.reference, '__module__', '?')}.{getattr(decl.reference, '__qualname__', '?')}"}
    entries = {}
    for variant in variants(decl):
        path = synth.write(Path(work) / f"{variant.name}.gguf", variant, hints_of(variant.arch))
        ids = ids_of(variant, 16)
        try:
            check_reference(path, ids, decl.reference, "reference", variant.name)
        except AssertionError as e:
            raise InvalidRequest(f"not recording the greedy chain of {variant.name}: {e}") from None
        chain = chains.reference_chain(lambda seq, p=path: decl.reference(p, np.asarray(seq, np.int64))[-1],
                                ids_of(variant, chains.N_PROMPT).tolist())
        entries[chains.key("synthetic", variant.name)] = {**chain, "input_sha256": bithash.file_sha256(path),
                                                   "reference": "the package's forward pass", "versions": vers}
        print(f"chain {variant.name}: {chain['tokens']}")
    goldens = Path(here) / "goldens"
    goldens.mkdir(exist_ok=True)
    return chains.write(goldens, entries, vers)
