"""Where two traces part: the ops both record, compared in execution order.

``compare(got, want)`` aligns two traces (``trace_format``) by op name, in ``got``'s order, and
measures each op both hold: max |got - want|, that relative to max(1, max |want|) (the measure
``first_diff`` and the kit use), and the cosine of the two. An op is *beyond tolerance* when its
relative error exceeds ``tolerance``. ``Report.table()`` prints, per layer, the first op beyond
tolerance and the first diverging op overall.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from archrun.conformance.trace_format import Trace, layer_of
from archrun.errors import BadTrace

TOLERANCE = 1e-4


@attrs.frozen
class OpError:
    """One aligned op: its name, index in the alignment and how far ``got`` is from ``want``."""

    index: int
    name: str
    max_abs: float
    rel: float
    cosine: float
    tolerance: float

    @property
    def layer(self) -> int | str:
        return layer_of(self.name)

    @property
    def op(self) -> str:
        return self.name.split("/", 1)[1]

    @property
    def ok(self) -> bool:
        return self.rel <= self.tolerance


@attrs.frozen
class Report:
    """Every aligned op's error (execution order) and the logits' relative error."""

    ops: tuple[OpError, ...]
    logits_rel: float
    tolerance: float

    @property
    def first(self) -> OpError | None:
        """The first op beyond tolerance (None: every aligned op agrees)."""
        return next((e for e in self.ops if not e.ok), None)

    @property
    def matches(self) -> bool:
        return self.logits_rel <= self.tolerance

    def per_layer(self) -> list[OpError]:
        """Per layer (and the head), its first op beyond tolerance."""
        seen: dict[int | str, OpError] = {}
        for e in self.ops:
            if not e.ok and e.layer not in seen:
                seen[e.layer] = e
        return list(seen.values())

    def table(self) -> str:
        """A table a person reads in seconds: per layer, where the two runs part."""
        lines = [f"{'layer':>6}  {'first op beyond tolerance':<26} {'max |err|':>10} {'rel':>10} {'cosine':>9}"]
        bad = {e.layer: e for e in self.per_layer()}
        for layer in dict.fromkeys(e.layer for e in self.ops):
            e = bad.get(layer)
            if e is None:
                lines.append(f"{layer!s:>6}  {'(all ops within tolerance)':<26}")
            else:
                lines.append(f"{layer!s:>6}  {e.op:<26} {e.max_abs:>10.3g} {e.rel:>10.3g} {e.cosine:>9.6f}")
        first = self.first
        lines.append(f"logits: rel {self.logits_rel:.3g} (tolerance {self.tolerance:g}): "
                     + ("match" if self.matches else "differ"))
        lines.append("first diverging op: " + ("none" if first is None else
                                               f"{first.name} (rel {first.rel:.3g}, cosine {first.cosine:.6f})"))
        return "\n".join(lines)


def rel_error(got: np.ndarray, want: np.ndarray) -> tuple[float, float, float]:
    """(max |got - want|, that over max(1, max |want|), cosine); NaN anywhere counts as infinitely far."""
    g, w = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    diff = np.abs(g - w)
    if not np.isfinite(diff).all():
        return math.inf, math.inf, math.nan
    max_abs = float(diff.max()) if diff.size else 0.0
    denom = float(np.linalg.norm(g) * np.linalg.norm(w))
    cosine = float(g @ w / denom) if denom > 0 else (1.0 if max_abs == 0 else 0.0)
    return max_abs, max_abs / max(1.0, float(np.abs(w).max()) if w.size else 1.0), cosine


def check_same_input(got: Trace, want: Trace) -> None:
    """BadTrace unless both traces ran the same token ids and have logits of one shape."""
    if got.ids.shape != want.ids.shape or not np.array_equal(got.ids, want.ids):
        raise BadTrace(f"the traces ran different token ids ({len(got.ids)} vs {len(want.ids)} tokens"
                       f"{'' if len(got.ids) != len(want.ids) else ', other values'}): trace both on the same prompt")
    if got.logits.shape != want.logits.shape:
        raise BadTrace(f"the traces' logits differ in shape: {list(got.logits.shape)} vs {list(want.logits.shape)} "
                       "(another vocabulary?)")


def compare(got: Trace, want: Trace, tolerance: float = TOLERANCE) -> Report:
    """Align ``got`` with ``want`` (the ops both record, in ``got``'s order) and measure every one."""
    check_same_input(got, want)
    rows = []
    for name in got.ops:
        if name in want.ops and got.ops[name].shape == want.ops[name].shape:
            rows.append(OpError(len(rows), name, *rel_error(got.ops[name], want.ops[name]), tolerance))
    return Report(tuple(rows), rel_error(got.logits, want.logits)[1], tolerance)
