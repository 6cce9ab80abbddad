"""The plugin boundary: every structural choice is a registered op, and the core knows none of them.

- Every slot of archrun.vocab.SLOTS holds a third-party op: a test plugin registers, for each
  slot, an op under a new name wrapping the built-in one and counting its calls; a family (or a
  caller's hints) selects them on a synthetic model; each is used, the logits are unchanged.
- Third-party kernel parts (a norm, an activation) run inside the fused decode path and change
  the logits exactly as their math predicts (checked against the built-in ops on a file whose
  weights absorb the difference).
- The compiler's source names no op; the core's import graph has no cycle.
- An unknown architecture loads only with its conventions stated (Python API and CLI).
"""

from __future__ import annotations

import ast
import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

import archrun
from archrun.contracts import OpCapabilities
from archrun.errors import UnsupportedArchitecture
from archrun.family import FamilyHints
from archrun.hookspecs import hookimpl
from archrun.kernels.decode.parts import SIGNATURES, part
from archrun.plugins import make_plugin_manager
from archrun.vocab import SLOTS, Op, build_vocabulary

CORE = Path(archrun.__file__).parent
F32 = np.float32
IDS = [5, 17, 3, 42, 8, 60, 11, 2, 29]

# -- every slot holds a third-party op ---------------------------------------------------------------

BUILTIN = {"norm": "rms", "rope": "neox", "attention": "causal", "activation": "silu", "residual": "sequential",
           "gating": "softmax", "moe": "topk", "softcap": "tanh", "block_style": "fused"}
COUNTED = {slot: f"counted_{name}" for slot, name in BUILTIN.items()}
# a transformer has no token mixer: the mixer slot's boundary is tests/plugins/test_contracts.py's (a counted mixer
# on a hybrid file); the shipped mixers are third-party already (archrun-recurrent); nor a stream op (one residual
# stream), whose only op is third-party (archrun-gemma3n-ops' altup)
TRANSFORMER_SLOTS = set(SLOTS) - {"mixer", "stream"}
# what a counted op hides from the core: its kernel parts (so every call goes through the op path)
HIDDEN = frozenset({"fused", "fused_input", "fused_layer", "slot_arrays", "act_part", "gate_part"})
COUNTED_METHODS = ("cos_sin", "ffn_input", "combine", "new_slot")


class Counted:
    """A built-in op's bound value, counting calls of itself and of its methods; no kernel parts."""

    def __init__(self, inner, slot: str, counts: collections.Counter):
        self._inner, self._slot, self._counts = inner, slot, counts

    def __getattr__(self, name):
        if name in HIDDEN:
            raise AttributeError(name)
        attr = getattr(self._inner, name)
        if name in COUNTED_METHODS:
            def counted(*args, **kw):
                self._counts[self._slot] += 1
                return attr(*args, **kw)

            return counted
        return attr

    def __call__(self, *args, **kw):
        self._counts[self._slot] += 1
        return self._inner(*args, **kw)


class CountingPlugin:
    """Registers counted_<name> for every slot (wrapping the built-in op), and the family 'boundary'
    that selects all of them."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.builtin = build_vocabulary(make_plugin_manager(names=["blocks"]))

    def _wrap(self, factory, slot):
        if factory is None:
            return None
        counts = self.counts
        if slot == "block_style":
            def style():
                base = factory()

                class CountedDecoder(base):
                    def __init__(self, *args, **kw):
                        counts["block_style"] += 1
                        super().__init__(*args, **kw)

                return CountedDecoder

            return style

        def make(*args):
            return Counted(factory(*args), slot, counts)

        return make

    @hookimpl
    def archrun_register_vocabulary(self, register):
        for slot, name in BUILTIN.items():
            op = self.builtin.entry(slot, name).op
            register(Op(slot, COUNTED[slot], self._wrap(op.reference, slot), self._wrap(op.fast, slot),
                        doc=f"{slot}={name}, counting calls"))

    @hookimpl
    def archrun_describe_family(self, architecture):
        if architecture != "boundary":
            return None
        return FamilyHints(name="boundary", rope_pairing=COUNTED["rope"], attention=COUNTED["attention"],
                           activation=COUNTED["activation"], residual=COUNTED["residual"], embed_scale=1.0,
                           norm=COUNTED["norm"], moe=COUNTED["moe"], gating=COUNTED["gating"],
                           softcap=COUNTED["softcap"], block_style=COUNTED["block_style"], moe_weights_norm=True)

    @hookimpl
    def archrun_families(self):
        return ["boundary"]


MOE = dict(n_expert=4, n_expert_used=2, n_ff_exp=32, key_overrides={"final_logit_softcapping": 4.0})


def test_the_counted_plugin_covers_every_slot():
    assert set(BUILTIN) == TRANSFORMER_SLOTS


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("via", ["family", "hints"])
def test_every_slot_can_hold_a_third_party_op(synth_model, backend, via):
    """A MoE model with a final softcap uses every slot; the same weights under 'qwen3moe' with the
    built-in ops (the qwen family's conventions, the same as 'boundary' states) are the oracle."""
    plugin = CountingPlugin()
    pm = make_plugin_manager(extra=[plugin])
    builtin_file = synth_model(arch="qwen3moe", **MOE)
    if via == "family":  # the family 'boundary' states the counted ops
        m = archrun.load(synth_model(arch="boundary", **MOE), backend=backend, plugins=pm)
    else:  # a caller's hints select them on top of the qwen3moe family's conventions
        hints = {"rope_pairing" if slot == "rope" else slot: name for slot, name in COUNTED.items()}
        m = archrun.load(builtin_file, backend=backend, plugins=pm, hints=hints)
    ref = archrun.load(builtin_file, backend=backend)
    for slot, name in COUNTED.items():
        assert m.plan.providers[f"{slot}={name}"] == pm.get_name(plugin)
    assert m.fused_blocks is None  # the counted ops carry no parts: every call goes through them
    assert plugin.counts["block_style"] == 1
    plugin.counts.clear()
    got, want = m.logits(IDS), ref.logits(IDS)
    assert set(plugin.counts) == TRANSFORMER_SLOTS - {"block_style"}, plugin.counts
    if backend == "reference":
        np.testing.assert_array_equal(got, want)
    else:  # the built-in fast moe op runs its kernel, the counted one the reference mixture: same products
        assert _rel(got, want) <= 1e-5
    plugin.counts.clear()
    cache, ref_cache = m.init_cache(len(IDS)), ref.init_cache(len(IDS))
    steps = np.stack([m.forward_step([t], cache) for t in IDS])
    assert plugin.counts["attention"] >= len(IDS) * m.descriptor.n_layer
    assert _rel(steps, np.stack([ref.forward_step([t], ref_cache) for t in IDS])) <= 1e-4
    assert _rel(steps, want) <= 1e-4


# -- third-party kernel parts decode fused -------------------------------------------------------------


@njit(SIGNATURES["activation"])
def _double_silu(p, x, out):
    """out = 2 silu(x): a gated FFN computes silu(gate) * (2 up)."""
    for i in range(x.shape[0]):
        g = x[i]
        out[i] = F32(2.0) * g / (F32(1.0) + np.exp(-g))


@njit(SIGNATURES["norm"])
def _twice_rms(p, x, w, b, out):
    """out = 2 rms_norm(x) w (+ b): RMSNorm with its weight doubled."""
    ss = 0.0
    for i in range(x.shape[0]):
        ss += np.float64(x[i]) * x[i]
    r = F32(2.0 / np.sqrt(ss / x.shape[0] + p[0]))
    for i in range(x.shape[0]):
        out[i] = x[i] * r * w[i]
    for i in range(b.shape[0]):
        out[i] += b[i]


def _np_double_silu(x, up=None):
    y = F32(2.0) * x / (F32(1.0) + np.exp(-x))
    return y if up is None else y * up


def _np_twice_rms(eps):
    def norm(x, w, b=None):
        ms = np.mean(np.square(x.astype(np.float64)), axis=-1, keepdims=True)
        y = (x / np.sqrt(ms + eps)).astype(F32) * (F32(2.0) * w)
        return y if b is None else y + b

    return norm


def _fast_activation():
    def act(x, up=None):
        return _np_double_silu(x, up)

    act.fused = part(_double_silu)
    return act


def _fast_norm(eps):
    op = _np_twice_rms(eps)

    def bound(x, w, b=None):
        return op(x, w, b)

    bound.fused = part(_twice_rms, eps)
    return bound


class PartsPlugin:
    """A third-party vocabulary with its own kernel parts (numba functions of the slots' signatures)."""

    @hookimpl
    def archrun_register_vocabulary(self, register):
        parts = OpCapabilities(fused=True)  # the fast ops carry kernel parts (archrun.contracts)
        register(Op("activation", "double_silu", lambda: _np_double_silu, _fast_activation, "2 silu(x)",
                    capabilities=parts))
        register(Op("norm", "twice_rms", _np_twice_rms, _fast_norm, "2 rms_norm(x) w", capabilities=parts))


# slot -> (op name, the tensors whose doubled weights give the built-in op the same result)
PARTS = {"activation": ("double_silu", lambda n: n.endswith("ffn_up.weight")),
         "norm": ("twice_rms", lambda n: n.endswith("norm.weight"))}


@pytest.mark.parametrize("slot", list(PARTS))
def test_third_party_kernel_parts_decode_fused(synth_model, slot):
    name, absorbs = PARTS[slot]
    pm = make_plugin_manager(extra=[PartsPlugin()])
    spec = dict(n_ff=64)  # qwen3: q/k norms use the norm op too
    path = synth_model(**spec)
    twin = synth_model(**spec, transform=lambda t: {k: v * F32(2.0) if absorbs(k) else v for k, v in t.items()})
    for backend in ("fast", "reference"):
        m = archrun.load(path, backend=backend, plugins=pm, hints={slot: name})
        ref = archrun.load(twin, backend=backend)  # the built-in ops on weights that absorb the factor 2
        plain = archrun.load(path, backend=backend)
        assert (m.fused_blocks is not None) == (backend == "fast")
        want = ref.logits(IDS)
        assert _rel(m.logits(IDS), want) <= 1e-5
        assert _rel(plain.logits(IDS), want) > 1e-2  # the new math really changed the logits
        cache = m.init_cache(len(IDS))
        steps = np.stack([m.forward_step([t], cache) for t in IDS])  # fused on the fast backend
        assert _rel(steps, want) <= 1e-4
    # the fused step is the op's part: the op path of the same model agrees with it token by token
    m = archrun.load(path, plugins=pm, hints={slot: name})
    op_model = archrun.load(path, plugins=pm, hints={slot: name}, fused=False)
    fused, ops = m.init_cache(len(IDS)), op_model.init_cache(len(IDS))
    for t in IDS:
        a = m.forward_step([t], fused)
        b = op_model.forward_step([t], ops)
        assert _rel(a, b) <= 1e-4


# -- the core names no op, and its imports have no cycle -----------------------------------------------


def test_the_compiler_source_names_no_op():
    """compile.py knows no vocabulary: no string constant in it is the name of a registered op of any
    slot (the names come from archrun.family's conventions, hints and tables)."""
    vocab = build_vocabulary(make_plugin_manager())
    names = {e.op.name for e in vocab}
    assert {"rms", "neox", "norm", "causal", "silu", "sequential", "softmax", "topk", "tanh", "fused"} <= names
    tree = ast.parse((CORE / "describe" / "compile.py").read_text())
    found = sorted({(n.value, n.lineno) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names})
    assert not found, f"compile.py names ops: {found}"


def _modules() -> dict[str, Path]:
    """Every module under core/archrun: dotted name -> file."""
    out = {}
    for f in CORE.rglob("*.py"):
        parts = ["archrun", *f.relative_to(CORE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks (never executed)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def import_graph() -> dict[str, set[str]]:
    """module -> the archrun modules it imports: `import`/`from` at module level or inside functions
    (not under `if TYPE_CHECKING:`), and modules named in a source that imports by name (importlib)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in mods and t != mod}
        if "import_module" in {getattr(n, "attr", getattr(n, "id", None)) for n in ast.walk(tree)}:
            # lazy imports by name (archrun/__init__'s _LAZY): every module named in the source
            graph[mod] |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in mods
                           and n.value != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            return cycle
    return None


def test_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_core_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "archrun.describe.compile" in graph["archrun.api"]
    assert "archrun.kernels.decode.block" in graph["archrun.kernels.decode.layer"]
    assert "archrun.plugins" in graph["archrun.describe.compile"]  # a function-level import counts
    assert "archrun.api" in graph["archrun"]  # archrun.load: a lazy import by name
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in core/archrun: " + " -> ".join(cycle)


# -- an unknown architecture: conventions stated by the caller -----------------------------------------

LLAMA = dict(qk_norm=False, n_ff=64)
MYSTERY_HINTS = {"rope_pairing": "norm", "attention": "causal", "activation": "silu", "residual": "sequential",
                 "embed_scale": "1.0"}


def test_unknown_architecture_needs_its_conventions(synth_model):
    path = synth_model(arch="mystery", **LLAMA)
    with pytest.raises(UnsupportedArchitecture) as e:
        archrun.load(path)
    msg = str(e.value)
    assert "'mystery'" in msg
    for name in ("rope_pairing", "activation", "residual", "attention", "embed_scale"):
        assert name in msg
    for name in ("softcap", "gating", "moe"):  # not needed by this file: not asked for
        assert f"{name} (" not in msg


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_unknown_architecture_with_hints_equals_its_family(synth_model, backend):
    """The same weights as 'llama' (family: NORM pairing) and as 'mystery' with hints: equal logits with
    rope_pairing=norm; NEOX pairing gives other logits, so the hint is what decides."""
    llama = archrun.load(synth_model(arch="llama", **LLAMA), backend=backend).logits(IDS)
    path = synth_model(arch="mystery", **LLAMA)
    m = archrun.load(path, backend=backend, hints=MYSTERY_HINTS)
    assert m.descriptor.rope_tables[0].pairing == "norm"
    np.testing.assert_array_equal(m.logits(IDS), llama)
    neox = archrun.load(path, backend=backend, hints=dict(MYSTERY_HINTS, rope_pairing="neox")).logits(IDS)
    assert _rel(neox, llama) > 1e-2


def test_cli_runs_an_unknown_architecture_with_hints(synth_model, capsys):
    from archrun.cli import main

    path = synth_model(arch="mystery", **LLAMA)
    hints = [a for k, v in MYSTERY_HINTS.items() for a in ("--hint", f"{k}={v}")]
    assert main(["run", str(path), "-p", "<t", "-n", "4", "--seed", "0", "--backend", "reference", *hints]) == 0
    assert capsys.readouterr().out.strip()


def test_cli_without_hints_prints_one_clear_error_line(synth_model):
    path = synth_model(arch="mystery", **LLAMA)
    exe = [sys.executable, "-c", "import sys; from archrun.cli import main; sys.exit(main())"]
    r = subprocess.run([*exe, "run", str(path), "-p", "hi", "-n", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("archrun: error: ") and "Traceback" not in r.stderr
    for name in ("rope_pairing", "activation", "residual", "attention", "embed_scale", "--hint"):
        assert name in lines[0]
