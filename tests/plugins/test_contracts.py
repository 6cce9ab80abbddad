"""The op contract (archrun.contracts): ops declare what they can do at registration, the vocabulary refuses a
declaration its slot cannot take, the binder refuses a bound op that lacks what it declares, and the core never
probes an op for a capability (an AST scan of core/archrun)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import archrun
from archrun.contracts import KERNEL_MEMBERS, SHARED_MEMBERS, SLOT_CAPABILITIES, VALUES, OpCapabilities, check_bound
from archrun.errors import PluginError
from archrun.hookspecs import hookimpl
from archrun.kernels.decode.parts import Part
from archrun.plugins import make_plugin_manager
from archrun.vocab import SLOTS, Op, Vocabulary, build_vocabulary

CORE = Path(archrun.__file__).resolve().parent

#: attribute names whose presence on an object is an op's capability (never to be probed by the core); `causal`
#: is also a model's property (an encoder), read on models, so it counts only on an op
CAPABILITY_NAMES = {*KERNEL_MEMBERS, *SHARED_MEMBERS, *VALUES, "bind", "mixer", "layout", "mix"} - {"causal"}
#: names the core gives bound op objects and vocabulary entries
OP_NAMES = {"op", "fast", "ref", "residual", "style", "layout", "act", "norm", "rope", "gating", "moe"}
#: attributes of a plan layer or FFN that hold bound ops (lp.attention, lp.ffn.moe, ...; an object's own
#: attributes of these names, self.attention, are its own business: a PairSlot's slots)
OP_ATTRIBUTES = {"attention", "residual", "moe", "parallel", "mixer", "act", "norm", "softcap", "layout"}


def _names_an_op(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in OP_NAMES
    own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    return isinstance(node, ast.Attribute) and node.attr in OP_ATTRIBUTES and not own


def probes(source: str) -> list[tuple[int, str]]:
    """(line, call) of each capability probe in `source`: hasattr(x, ...) or getattr(x, ..., default) where
    the attribute is a capability name, or x is an op (a name or attribute the core gives bound ops). A
    two-argument getattr reads what must be there (it raises), so it is not a probe."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr",
                                                                                                  "hasattr")):
            continue
        if node.func.id == "getattr" and len(node.args) < 3:
            continue
        if len(node.args) < 2:
            continue
        obj, attr = node.args[0], node.args[1]
        capability = isinstance(attr, ast.Constant) and attr.value in CAPABILITY_NAMES
        if capability or _names_an_op(obj):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_probe_scan_finds_probes():
    """The scan itself: each shape of probe the core once had is found; plain reads and other objects are not."""
    flagged = [
        'fn = getattr(op, "pool_task", None)',
        'fused_for = getattr(op, "fused_for", None)',
        'act = getattr(lp.ffn.moe, "act_part", None)',
        'ok = callable(getattr(lp.attention, "slot_arrays", None))',
        'b = _Binder(d, g, v, backend, getattr(style, "op_backend", None) or backend)',
        'mixer = getattr(layout, "mixer", False)',
        'x = hasattr(thing, "kv_types")',
        'p = getattr(op, attr, None)',
        'c = getattr(lp.attention, "causal", True)',
    ]
    for line in flagged:
        assert probes(line), line
    for line in ('p = getattr(op, "fused")', 'n = getattr(args, "func", None)', 'x = hasattr(tokenizer, "eog_ids")',
                 'v = getattr(self.fam, name)', 'n = getattr(self.mixer, "nbytes", 0)',
                 'c = getattr(model, "causal", True)'):
        assert not probes(line), line


def test_the_core_never_probes_an_op():
    found = {}
    for path in sorted(CORE.rglob("*.py")):
        hits = probes(path.read_text())
        if hits:
            found[str(path.relative_to(CORE))] = hits
    assert not found, f"capability probes in the core (declare them in archrun.contracts.OpCapabilities): {found}"


def _vocab_with(op: Op) -> Vocabulary:
    vocab = Vocabulary()
    vocab.register(op, "test-plugin")
    return vocab


def _ref(*_args):
    return None


@pytest.mark.parametrize("op, message", [
    (Op("softcap", "x", _ref, _ref, capabilities=OpCapabilities(fused=True)), "slot 'softcap' does not take"),
    (Op("norm", "x", _ref, _ref, capabilities=OpCapabilities(causal=False)), "declares causal"),
    (Op("residual", "x", _ref, _ref, capabilities=OpCapabilities(pool_task=True)), "declares pool_task"),
    (Op("norm", "x", _ref, None, capabilities=OpCapabilities(fused=True)), "has no fast factory"),
    (Op("attention", "x", _ref, _ref, capabilities={"fused": True}), "not an archrun.contracts.OpCapabilities"),
    (Op("mixer", "x", _ref, _ref), "has no layout"),
])
def test_a_malformed_declaration_is_refused_at_registration(op, message):
    with pytest.raises(PluginError, match=message) as e:
        _vocab_with(op)
    assert "test-plugin" in str(e.value)


def test_a_value_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError):
        OpCapabilities(fused="yes")
    with pytest.raises(ValueError):
        OpCapabilities(op_backend="fast")


def test_every_slot_has_a_declared_contract():
    assert set(SLOT_CAPABILITIES) == set(SLOTS)


def test_the_reference_backend_carries_no_kernel_member():
    caps = OpCapabilities(fused=True, kv_types=True, binds=True, causal=False)
    op = Op("attention", "x", _ref, _ref, capabilities=caps)
    assert op.declared("fast") == caps
    ref = op.declared("reference")
    assert not ref.fused and ref.kv_types and ref.binds and not ref.causal
    assert not Op("attention", "y", _ref, None).declared("fast").fused  # no fast factory: the reference's


class _Bound:
    fused = None  # declared, but none for this instance

    def __init__(self, **members):
        self.__dict__.update(members)


def test_a_bound_op_must_carry_what_it_declares():
    check_bound(_Bound(), OpCapabilities(fused=True), "norm", "x")  # None: no part for this instance
    check_bound(_Bound(fused=Part(_ref, None)), OpCapabilities(fused=True), "norm", "x")
    with pytest.raises(PluginError, match="declares 'fused_input' but its bound _Bound has no such attribute"):
        check_bound(_Bound(), OpCapabilities(fused=True, fused_input=True), "residual", "x")
    with pytest.raises(PluginError, match=r"_Bound.fused is 3"):
        check_bound(_Bound(fused=3), OpCapabilities(fused=True), "norm", "x")
    with pytest.raises(PluginError, match=r"kv_types"):
        check_bound(_Bound(kv_types=["f32"]), OpCapabilities(kv_types=True), "attention", "x")
    with pytest.raises(PluginError, match="MixerOp"):
        check_bound(_Bound(), OpCapabilities(), "mixer", "x")


def test_token_mixers_have_their_own_slot():
    vocab = build_vocabulary(make_plugin_manager())
    mixers = {e.op.name for e in vocab if e.op.slot == "mixer"}
    if not mixers:
        pytest.skip("no token-mixer plugin installed")
    assert all((("attention", name) not in vocab) for name in mixers)
    assert all(e.op.layout is not None for e in vocab if e.op.slot == "mixer")


def test_archrun_plugins_lists_mixers_in_their_own_slot(capsys):
    from archrun.cli import main

    vocab = build_vocabulary(make_plugin_manager())
    mixers = sorted(e.op.name for e in vocab if e.op.slot == "mixer")
    if not mixers:
        pytest.skip("no token-mixer plugin installed")
    assert main(["plugins"]) in (0, None)
    out = capsys.readouterr().out
    assert all(f"mixer={name}" in out for name in mixers), out
    assert not any(f"attention={name}" in out for name in mixers), out


def test_diagnosis_swaps_an_op_only_within_its_slot():
    """On a hybrid file (LFM2: short convolutions and attention), the single changes the diagnosis tries
    put an attention op only where an attention op was and a token mixer only where a mixer was."""
    pytest.importorskip("archrun_lfm2")
    from archrun.conformance.trace import Skipped, changes
    from archrun.describe.compile import compile_gguf

    path = Path(__file__).resolve().parents[2] / "families/archrun-lfm2/tests/goldens/lfm2_ccac.gguf"
    pm = make_plugin_manager(names=["blocks", "recurrent", "lfm2"])
    d = compile_gguf(path, pm).descriptor
    vocab = build_vocabulary(pm)
    assert {ly.attention.slot for ly in d.layers} == {"attention", "mixer"}
    swaps = 0
    for what, alt in changes(d, vocab):
        if isinstance(alt, Skipped):
            continue
        for before, after in zip(d.layers, alt.layers, strict=True):
            if after.attention.kind != before.attention.kind:
                swaps += 1
                assert after.attention.slot == before.attention.slot, what
                assert (after.attention.slot, after.attention.kind) in vocab, what
    assert swaps  # the attention layers' op was swapped for another attention op


def test_recovery_offers_mixers_only_for_mixer_conventions():
    """`archrun recover`'s candidate values: the `recurrent`/`parallel` conventions take token mixers only,
    `attention` attention ops only."""
    from archrun.conformance.recover import moves, vocab_names
    from archrun.family import FamilyHints

    pm = make_plugin_manager(names=["blocks", "recurrent"])
    vocab = build_vocabulary(pm)
    names = vocab_names(pm)
    hints = FamilyHints(name="x", attention="causal", recurrent="shortconv")
    offered = list(moves(hints, names, ["attention", "recurrent", "parallel"]))
    mixers = {e.op.name for e in vocab if e.op.slot == "mixer"}
    assert mixers and {v for f, v in offered if f in ("recurrent", "parallel")} == mixers
    attention = {v for f, v in offered if f == "attention"}
    assert attention and not attention & mixers and all(("attention", v) in vocab for v in attention)


class _CountedShortConv:
    """A third-party token mixer: archrun-recurrent's shortconv under another name, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def archrun_register_vocabulary(self, register) -> None:
        inner = build_vocabulary(make_plugin_manager(names=["recurrent"])).entry("mixer", "shortconv").op
        plugin = self

        class Counted:
            def __init__(self, spec) -> None:
                self.inner = inner.reference(spec)

            def bind(self, binder, layer: int) -> None:
                self.inner.bind(binder, layer)

            def new_slot(self, capacity: int, max_rewind: int = 64):
                return self.inner.new_slot(capacity, max_rewind)

            def mix(self, h, slot, start: int):
                plugin.calls += 1
                return self.inner.mix(h, slot, start)

        register(Op("mixer", "counted_shortconv", Counted, None, "shortconv, counting calls", layout=inner.layout))


def test_a_third_party_mixer_runs_a_hybrid_models_mixer_layers():
    """The mixer slot's boundary: a caller's hint puts a test plugin's mixer on LFM2's short-convolution
    layers; it runs there (and only there), and the logits are the shipped mixer's."""
    pytest.importorskip("archrun_lfm2")
    import numpy as np

    path = Path(__file__).resolve().parents[2] / "families/archrun-lfm2/tests/goldens/lfm2_ccac.gguf"
    counted = _CountedShortConv()
    pm = make_plugin_manager(names=["blocks", "recurrent", "lfm2"], extra=[counted])
    ids = [1, 5, 9, 2, 7]
    want = archrun.load(path, backend="reference", plugins=pm).logits(ids)
    m = archrun.load(path, backend="reference", plugins=pm, hints={"recurrent": "counted_shortconv"})
    kinds = [ly.attention.kind for ly in m.descriptor.layers if ly.attention.mixer]
    assert kinds and set(kinds) == {"counted_shortconv"}
    assert m.plan.providers["mixer=counted_shortconv"] == pm.get_name(counted)
    np.testing.assert_array_equal(m.logits(ids), want)
    assert counted.calls == len(kinds)  # one whole-sequence call per mixer layer
