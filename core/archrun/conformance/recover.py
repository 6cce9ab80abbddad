"""The recovery loop: the conventions a file cannot state, found from a reference trace.

``recover(path, reference)`` searches the family conventions (``archrun.family.FamilyHints``
fields: rope pairing, norm op, activation, residual topology, attention op, embedding scale,
pre-norms, sliding-window and NoPE periods, the sliding layers' rope, Q/K norms after rope, MoE
gating and renormalisation, softcap op, logit-scale use) guided by the divergence: it traces the
model, finds the first aligned op beyond tolerance (``diverge``), tries the changes that can
move that op (``GUIDE``) one at a time, then in pairs, then the others, and keeps a change only
when it moves the first divergence later (or makes the logits match). Then it re-traces and goes
on from the next diverging op. It stops when the logits match (``Recovery``), or with
``NotRecovered`` naming the op no change reproduces, or when its time budget runs out.

The candidate conventions come from what the file's compiler reads as hints and the names
installed vocabulary registers in each slot: the loop knows no family and no math.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from archrun.conformance.diverge import TOLERANCE, Report, compare
from archrun.conformance.trace_format import Trace, from_records
from archrun.descriptor import NO_ROPE
from archrun.errors import ArchrunError, NotRecovered
from archrun.family import CONVENTIONS, TRANSFORMER, FamilyHints
from archrun.hookspecs import hookimpl

#: Conventions whose values are token mixers (slot "mixer").
MIXER_FIELDS = ("recurrent", "parallel", "mixerless")
#: Conventions named by a registry slot: hint field -> slot.
SLOT_FIELDS = {name: slot for name, (_, slot) in CONVENTIONS.items()
               if slot is not None and name not in MIXER_FIELDS}
#: Conventions whose candidate values are what the installed family plugins declare (``Declared``).
DECLARED_FIELDS = ("tensor_names", "defaults")
#: Conventions with a fixed set of values: hint field -> values.
VALUE_FIELDS: Mapping[str, tuple[Any, ...]] = {
    "embed_scale": (1.0, "sqrt_n_embd"),
    "pre_norms": (True, False),
    "norm_weights": (True, False),
    "qk_norm_after_rope": (False, True),
    "swa_period": (0, 2, 3, 4, 6),
    "swa_rope": ("global", "plain"),
    "nope_period": (0, 2, 4),
    "nope_global": (False, True),
    "moe_weights_norm": (False, True),
    "logit_scale_key": ("multiply", "divide"),
}
#: Which conventions can move an aligned op's output (trace_format's op names; "logits" when only
#: the final logits differ). The guide orders the search, it never limits it.
GUIDE: Mapping[str, tuple[str, ...]] = {
    "attn_out": ("rope_pairing", "attention", "qk_norm_after_rope", "swa_period", "swa_rope", "nope_period",
                 "nope_global", "norm", "norm_weights", "pre_norms", "embed_scale", "residual", "defaults",
                 "tensor_names"),
    "ffn_out": ("activation", "gating", "moe_weights_norm", "moe", "norm", "pre_norms", "residual", "embed_scale",
                "tensor_names", "defaults"),
    "block": ("residual", "pre_norms", "norm", "embed_scale", "tensor_names"),
    "final_norm": ("norm", "norm_weights", "embed_scale", "tensor_names"),
    "output": ("logit_scale_key", "norm"),
    "logits": ("softcap", "logit_scale_key", "embed_scale"),
}
BUDGET_SECONDS = 300.0
#: A change that does not move the first divergence is kept when it shrinks the error there this many times.
REDUCE = 2.0


@attrs.frozen
class Step:
    """One accepted change: the hints it set, and the first diverging op before and after it."""

    changes: Mapping[str, Any]
    before: str
    after: str
    evaluations: int


@attrs.frozen
class Recovery:
    """What the loop found: the hints that make the model match, and what it cost."""

    architecture: str
    hints: FamilyHints
    steps: tuple[Step, ...]
    report: Report
    evaluations: int
    seconds: float

    def stated(self) -> dict[str, Any]:
        """The found conventions as caller hints (``archrun.load(path, hints=...)``, ``--hint``)."""
        return hint_dict(self.hints)

    def describe(self) -> str:
        lines = [f"{len(self.steps)} change(s), {self.evaluations} traced runs, {self.seconds:.1f} s; "
                 f"logits rel {self.report.logits_rel:.3g}"]
        for s in self.steps:
            what = ", ".join(f"{k}={v}" for k, v in s.changes.items())
            lines.append(f"  {what}: first divergence {s.before} -> {s.after}")
        lines.append("hints: " + " ".join(f"--hint '{k}={json.dumps(v)}'" if isinstance(v, Mapping)
                                          else f"--hint {k}={v}" for k, v in self.stated().items()))
        return "\n".join(lines)


def hint_dict(hints: FamilyHints) -> dict[str, Any]:
    """The convention fields of ``hints`` that differ from FamilyHints' defaults (caller-hint form;
    ``defaults`` and ``tensor_names`` as plain dicts)."""
    skip = {"name", "generic", "caller", "ignored_tensors", "chat_template"}
    blank = FamilyHints(name=hints.name)
    return {a.name: dict(v) if isinstance(v := getattr(hints, a.name), Mapping) else v
            for a in attrs.fields(FamilyHints)
            if a.name not in skip and getattr(hints, a.name) != getattr(blank, a.name)}


@attrs.frozen
class Declared:
    """Candidate values no registry names: the key defaults and tensor-role remaps the installed
    family plugins declare (``FamilyHints.defaults`` and ``tensor_names``), kept when they can apply
    to the file (a default for a key it lacks; a remap whose tensors it has)."""

    defaults: tuple[tuple[str, Any], ...] = ()
    tensor_names: tuple[Mapping[str, Any], ...] = ()


def declared(pm: Any, path: str | Path) -> Declared:
    """What the installed family plugins declare that could apply to the model at ``path``."""
    from archrun.io.ggufset import open_gguf

    g = open_gguf(path)
    arch = str(g.metadata["general.architecture"])
    n_layer = int(g.metadata.get(f"{arch}.block_count", 0) or 0)

    def present(target: Any) -> bool:
        alternatives = target if isinstance(target, tuple) else (target,)
        return any(t is None or any(t.format(i=i) in g.tensors for i in range(max(n_layer, 1)))
                   for t in alternatives)

    defaults: dict[tuple[str, str], tuple[str, Any]] = {}
    remaps: dict[str, Mapping[str, Any]] = {}
    for family in sorted({a for names in pm.hook.archrun_families() for a in names}):
        hints = pm.hook.archrun_describe_family(architecture=family)
        if hints is None:
            continue
        for key, value in hints.defaults.items():
            if f"{arch}.{key}" not in g.metadata:
                defaults.setdefault((key, repr(value)), (key, value))
        if hints.tensor_names and all(present(t) for t in hints.tensor_names.values()):
            remaps.setdefault(repr(sorted(hints.tensor_names.items())), dict(hints.tensor_names))
    return Declared(tuple(defaults.values()), tuple(remaps.values()))


class _Probe:
    """A family plugin answering for one architecture with the candidate under test (tried first)."""

    def __init__(self, architecture: str):
        self.architecture, self.hints = architecture, None

    @hookimpl(tryfirst=True)
    def archrun_describe_family(self, architecture: str) -> FamilyHints | None:
        return self.hints if architecture == self.architecture else None


def trace_gguf(path: str | Path, ids: Sequence[int], backend: str = "reference", plugins: Any = None,
               hints: Mapping[str, Any] | None = None) -> Trace:
    """archrun's trace of the model at ``path`` on ``ids``."""
    import archrun
    from archrun.conformance.trace import trace

    model = archrun.load(path, backend=backend, plugins=plugins, hints=hints)
    logits, records = trace(model, ids)
    return from_records(ids, logits, records, Path(path).name)


class _Search:
    """The state of one recovery: the file, the reference, the probe and the cost so far."""

    def __init__(self, path: Path, reference: Trace, plugins: Any, backend: str, tolerance: float,
                 budget: float):
        from archrun.io.ggufset import open_gguf
        from archrun.plugins import make_plugin_manager

        self.path, self.reference, self.backend, self.tolerance = path, reference, backend, tolerance
        self.deadline, self.started, self.evaluations = time.monotonic() + budget, time.monotonic(), 0
        self.pm = plugins if plugins is not None else make_plugin_manager()
        self.architecture = str(open_gguf(path).metadata["general.architecture"])
        self.family = self.pm.hook.archrun_describe_family(architecture=self.architecture)
        self.known = declared(self.pm, path)
        self.probe = _Probe(self.architecture)
        self.pm.register(self.probe)
        self.skipped: list[str] = []

    def close(self) -> None:
        self.pm.unregister(self.probe)

    def evaluate(self, hints: FamilyHints) -> Report | None:
        """The candidate's divergence report, or None when the model cannot run it (the reason kept)."""
        self.evaluations += 1
        self.probe.hints = hints
        try:
            got = trace_gguf(self.path, self.reference.ids, self.backend, self.pm)
        except (ArchrunError, ValueError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
            self.skipped.append(f"{type(e).__name__}: {e}")
            return None
        return compare(got, self.reference, self.tolerance)

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline


def score(report: Report) -> tuple[int, float]:
    """Higher is closer: (aligned ops before the first divergence (all + 1 when the logits match), -log rel there)."""
    first = report.first
    if first is None:
        n = len(report.ops) + (1 if report.matches else 0)
        return n, -math.log10(max(report.logits_rel, 1e-30))
    return first.index, -math.log10(max(first.rel, 1e-30))


def where(report: Report) -> str:
    first = report.first
    if first is not None:
        return first.name
    return "none (logits match)" if report.matches else "the final logits"


def moves(hints: FamilyHints, vocab_names: Mapping[str, list[str]], fields: Iterable[str],
          known: Declared = Declared()) -> Iterator[tuple[str, Any]]:
    """(field, value) for every other value of each field in ``fields``: registry names (SLOT_FIELDS;
    MIXER_FIELDS: the token mixers; "attention": after the standard ops those with their own
    projections), VALUE_FIELDS, or what
    installed families declare (``known``: one more key default, or another tensor-role remap)."""
    for name in fields:
        if name == "defaults":
            for key, value in known.defaults:
                if key not in hints.defaults or hints.defaults[key] != value:
                    yield name, {**hints.defaults, key: value}
            continue
        if name == "tensor_names":
            for remap in [*known.tensor_names, *([{}] if hints.tensor_names else [])]:
                if dict(remap) != dict(hints.tensor_names):
                    yield name, remap
            continue
        if name in MIXER_FIELDS:
            values = vocab_names.get("mixer", [])
        elif name in SLOT_FIELDS:
            values = vocab_names.get(SLOT_FIELDS[name], [])
            if name == "attention":
                values = [*values, *vocab_names.get(OWN_PROJECTIONS, [])]
        else:
            values = VALUE_FIELDS.get(name, ())
        if name == "rope_pairing":
            values = [*values, NO_ROPE]  # the descriptor's "no rotary embedding" (learned positions, ALiBi)
        for value in dict.fromkeys(values):
            if value != getattr(hints, name):
                yield name, value


#: vocab_names' key of the attention ops with their own projections (MLA, gated attention).
OWN_PROJECTIONS = "attention/own projections"


def vocab_names(pm: Any) -> dict[str, list[str]]:
    """slot -> registered names; under "attention" the ops that read the standard projections, under
    ``OWN_PROJECTIONS`` those with their own (MLA: they need tensors a standard layer does not carry);
    under "mixer" the token mixers."""
    from archrun.vocab import build_vocabulary

    names: dict[str, list[str]] = {}
    for entry in build_vocabulary(pm):
        op = entry.op
        own = op.slot == "attention" and op.layout is not None
        names.setdefault(OWN_PROJECTIONS if own else op.slot, []).append(op.name)
    return names


def starting_hints(architecture: str, family: FamilyHints | None, vocab_names: Mapping[str, list[str]]) -> FamilyHints:
    """The family's hints, or for an architecture no family describes, a first guess for each convention
    (the shared transformer choices, the first registered rope pairing, activation and expert gating,
    no embedding scale)."""
    if family is not None:
        return attrs.evolve(family, caller=frozenset())
    first = {f: vocab_names[SLOT_FIELDS[f]][0] for f in ("rope_pairing", "activation", "gating")
             if vocab_names.get(SLOT_FIELDS[f])}
    return FamilyHints(name=architecture, embed_scale=1.0, **{**TRANSFORMER, **first})


def _combos(options: list[tuple[str, Any]], size: int) -> Iterator[tuple[tuple[str, Any], ...]]:
    """Every ``size`` moves on distinct fields."""
    for combo in itertools.combinations(options, size):
        if len({f for f, _ in combo}) == size:
            yield combo


def _with_a_default(options: list[tuple[str, Any]]) -> Iterator[tuple[tuple[str, Any], ...]]:
    """Every two moves on distinct fields other than "defaults", with one more key default (a number a
    file omits matters only with the op that reads it: ALiBi's maximum bias with the ALiBi op)."""
    plain = [m for m in options if m[0] != "defaults"]
    extra = [m for m in options if m[0] == "defaults"]
    for pair in _combos(plain, 2):
        for d in extra:
            yield (*pair, d)


def _key(move: tuple[str, Any]) -> tuple[str, str]:
    return move[0], repr(move[1])


def every_field() -> list[str]:
    """Every convention the loop searches."""
    return [*SLOT_FIELDS, *VALUE_FIELDS, *MIXER_FIELDS, *DECLARED_FIELDS]


def _step(search: _Search, cur: FamilyHints, rep: Report, names: Mapping[str, list[str]],
          changed: Sequence[str]) -> tuple[FamilyHints, Report, dict[str, Any]] | None:
    """The best change that moves the first divergence of ``rep`` later: one field (guided, then the
    rest); else one field that shrinks the error at that op ``REDUCE`` times (a partial fix); else two
    fields. The last two stages draw on the guided fields and those changed before (so an earlier choice
    can be revised)."""
    first = rep.first
    op = "logits" if first is None else first.op.split("#")[0]
    every = every_field()
    # a reference of logits alone guides nothing: every convention is a candidate
    guided = [f for f in GUIDE.get(op, ()) if f in every] if rep.ops else every
    rest = [f for f in every if f not in guided]
    base = score(rep)

    def advances(got: Report) -> bool:
        return score(got)[0] > base[0]

    def reduces(got: Report) -> bool:
        return score(got)[0] == base[0] and score(got)[1] > base[1] + math.log10(REDUCE)

    revisable = list(dict.fromkeys([*guided, *changed]))
    # (fields, how the moves combine, what counts, whether the first hit ends the stage)
    stages = ((guided, 1, advances, False), (rest, 1, advances, False), (revisable, 1, reduces, False),
              (revisable, 2, advances, False), (revisable, "pair and a default", advances, True))
    failed: set[tuple[str, str]] = set()  # the single moves the model cannot run with
    seen: dict[tuple[tuple[str, str], ...], Report | None] = {}  # a stage repeats an earlier one's moves
    for fields, size, good, first_hit in stages:
        best: tuple[FamilyHints, Report, dict[str, Any]] | None = None
        options = list(moves(cur, names, fields, search.known))
        combos = _with_a_default(options) if size == "pair and a default" else _combos(options, size)
        for combo in combos:
            if search.out_of_time():
                return best
            if size != 1 and sum(_key(m) in failed for m in combo[:2]) == 2:
                continue  # two changes the model cannot run with, each alone: seldom a pair that runs
            cand = attrs.evolve(cur, **dict(combo))
            key = tuple(map(_key, combo))
            got = seen[key] if key in seen else search.evaluate(cand)
            seen[key] = got
            if got is None and size == 1:
                failed.add(_key(combo[0]))
            if got is not None and got.matches:  # the logits match: done, whatever an aligned op says
                return cand, got, dict(combo)
            if got is not None and good(got) and (best is None or score(got) > score(best[1])):
                best = (cand, got, dict(combo))
                if first_hit:
                    return best
        if best is not None:
            return best
    return None


def _first_runnable(search: _Search, cur: FamilyHints, names: Mapping[str, list[str]]
                    ) -> tuple[FamilyHints, Report, dict[str, Any]]:
    """The closest single change of ``cur`` that runs at all (a model may not load without one: e.g.
    blocks without pre-norms have no pre-norm tensors), else the closest pair of changes."""
    why = search.skipped[-1]
    options = list(moves(cur, names, every_field(), search.known))
    for size in (1, 2):
        best: tuple[FamilyHints, Report, dict[str, Any]] | None = None
        for combo in _combos(options, size):
            if search.out_of_time():
                break
            cand = attrs.evolve(cur, **dict(combo))
            got = search.evaluate(cand)
            if got is not None and (best is None or score(got) > score(best[1])):
                best = (cand, got, dict(combo))
        if best is not None:
            return best
    raise NotRecovered(f"{search.architecture}: the model does not run with the starting conventions ({why}), "
                       "nor with any one or two of them changed")


def _not_recovered(search: _Search, rep: Report, steps: list[Step]) -> NotRecovered:
    first = rep.first
    at = (f"op {first.name} (rel {first.rel:.3g}, cosine {first.cosine:.6f})" if first is not None
          else f"the final logits (rel {rep.logits_rel:.3g}) after every aligned op agrees" if rep.ops
          else f"in the final logits (rel {rep.logits_rel:.3g}; the reference has no per-op activations)")
    done = "; ".join(", ".join(f"{k}={v}" for k, v in s.changes.items()) for s in steps) or "none"
    why = ("the time budget ran out" if search.out_of_time() else
           "no installed vocabulary reproduces it with any one or two convention changes (nor two and a key "
           "default an installed family declares; the math of an op, a weight layout or a key may differ)")
    return NotRecovered(f"{search.architecture}: the first diverging op is {at}: {why}; changes kept: {done}; "
                        f"{search.evaluations} traced runs in {time.monotonic() - search.started:.1f} s")


def recover(path: str | Path, reference: Trace, plugins: Any = None, backend: str = "reference",
            tolerance: float = TOLERANCE, budget: float = BUDGET_SECONDS, start: FamilyHints | None = None
            ) -> Recovery:
    """Find the conventions that make the model at ``path`` match ``reference`` (see the module docstring).

    ``start``: the hints to start from (default: the family's, or a first guess for an architecture
    no family describes). Raises NotRecovered when no combination fits or the budget runs out.
    """
    search = _Search(Path(path), reference, plugins, backend, tolerance, budget)
    try:
        names = vocab_names(search.pm)
        cur = start or starting_hints(search.architecture, search.family, names)
        rep = search.evaluate(cur)
        steps: list[Step] = []
        if rep is None:
            cur, rep, changes = _first_runnable(search, cur, names)
            steps.append(Step(changes, "the model does not load", where(rep), search.evaluations))
        while not rep.matches:
            found = _step(search, cur, rep, names, [k for st in steps for k in st.changes])
            if found is None:
                raise _not_recovered(search, rep, steps)
            before, (cur, rep, changes) = where(rep), found
            steps.append(Step(changes, before, where(rep), search.evaluations))
        return Recovery(search.architecture, cur, tuple(steps), rep, search.evaluations,
                        time.monotonic() - search.started)
    finally:
        search.close()


def reference_trace(reference: str | Path, gguf_path: str | Path, prompt: str) -> Trace:
    """The reference as a Trace: a trace file, or an HF model directory traced on the prompt's ids
    (tokenized by the GGUF file's own tokenizer, so both runs read the same ids)."""
    from archrun.conformance import trace_format
    from archrun.errors import BadTrace

    ref = Path(reference)
    if ref.is_dir():
        if not (ref / "config.json").is_file():
            raise BadTrace(f"{ref}: an HF model directory needs a config.json")
        from archrun.conformance.hf_trace import load_hf, trace_hf
        from archrun.text.tokenizer import Tokenizer

        ids = Tokenizer.from_gguf(gguf_path).encode(prompt)
        return trace_hf(load_hf(ref), ids, ref.name)
    return trace_format.load(ref)
