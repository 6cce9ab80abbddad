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

import contextlib
import io
import json
import zlib
from collections.abc import Callable, Sequence
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
    (default: one standard dense model per architecture the package describes). ``reference``:
    an independent forward pass ``reference(path, ids) -> logits [n, vocab]`` (numpy, reading the
    file without archrun), checked on every variant.
    """

    entry_point: str
    synthetic: Sequence[Synthetic] = attrs.field(default=(), converter=tuple)
    reference: Callable[[Path, np.ndarray], np.ndarray] | None = None

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
    if decl.synthetic:
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
    from archrun.kernels.parts import slot_part

    out = []
    for i, lp in enumerate(model.plan.layers):
        ffn = lp.ffn
        checks = [("attention", lp.attention, f"attention={lp.spec.attention.kind}"),
                  ("residual", lp.residual, f"residual={lp.spec.residual}")]
        if hasattr(ffn, "act"):
            checks.append(("activation", ffn.act, f"activation={lp.spec.ffn.activation}"))
        for slot, op, label in checks:
            try:
                has = slot_part(op, slot) is not None
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
    from archrun.compile import describe

    d = describe(path)
    text = json.dumps(d.to_dict())
    back = descriptor_from_dict(json.loads(text))
    assert back == d, f"{name}: the descriptor changes through JSON: {d} vs {back}"


def check_inspect(path: Path, entry_point: str, name: str) -> None:
    """`archrun inspect --json` names the family, every op's provider (all installed), the descriptor."""
    from archrun.cli import main
    from archrun.compile import describe

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["inspect", str(path), "--json"])
    assert status == 0, f"{name}: archrun inspect failed ({status}): {err.getvalue()}"
    info = json.loads(out.getvalue())
    d = describe(path)
    assert info["architecture"] == d.architecture
    assert info["descriptor"] == json.loads(json.dumps(d.to_dict())), f"{name}: inspect shows another descriptor"
    missing = [op for op, plugin in info["providers"].items() if plugin is None]
    assert not missing, f"{name}: archrun inspect finds no provider for {missing}"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        main(["inspect", str(path)])
    for op, plugin in info["providers"].items():
        assert op in text.getvalue() and plugin in text.getvalue(), f"{name}: text inspect omits {op} ({plugin})"


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
    from archrun.conformance.trace import diagnose

    want = np.asarray(reference(path, ids), dtype=np.float64)
    got = archrun.load(path, backend=backend).logits(ids)
    msg = _diff_message(f"{name} ({backend}): logits vs the package's reference forward pass", got, want, tolerance)
    if msg is not None:
        raise AssertionError(msg + "\n" + diagnose(path, ids, want, tolerance, reference_name="the reference"))


# ------------------------------------------------------------------------------ the test class


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
        key = (self.declaration.entry_point, variant.name)
        if key not in ConformanceKit._files:
            folder = tmp_path_factory.mktemp(f"conformance-{variant.name}")
            ConformanceKit._files[key] = synth.write(folder / f"{variant.name}.gguf", variant, hints_of(variant.arch))
        return ConformanceKit._files[key]

    def model(self, path: Path, backend: str, block_style: str | None = None) -> Any:
        import archrun

        key = (str(path), backend, block_style or "")
        if key not in ConformanceKit._models:
            if len(ConformanceKit._models) > 16:
                ConformanceKit._models.clear()
            ConformanceKit._models[key] = archrun.load(path, backend=backend, block_style=block_style)
        return ConformanceKit._models[key]

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
        check_fused(self.model(path, "fast", "fused"), ids_of(variant), variant.name)

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

        try:
            check_fast_op(op_entry)
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


def _all_described() -> set[str]:
    from archrun.plugins import default_plugin_manager

    return {a for lst in default_plugin_manager().hook.archrun_families() for a in lst}
