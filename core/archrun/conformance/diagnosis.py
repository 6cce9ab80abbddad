"""The diagnosis of logits that do not match an independent reference (the kit's failure report).

``diagnose(path, ids, want, ...)`` names the first position and element where archrun's logits differ
and tries the single descriptor changes of archrun.conformance.trace (``changes``); when one makes
archrun match, it names the convention the model states wrongly and the first diverging op. When none
does, the recovery loop of ``archrun recover`` (archrun.conformance.recover) searches combinations of
conventions against the reference's logits, within ``RECOVERY_BUDGET``. (A module of its own: the
recovery loop traces through archrun.conformance.trace, which therefore cannot import it.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from archrun.conformance.trace import Skipped, build, changes, first_diff, first_divergence, trace


def diagnose(path: str | Path, ids: Sequence[int], want: np.ndarray, tolerance: float,
             plugins: Any = None, hints: Any = None, reference_name: str = "the reference") -> str:
    """Explain why archrun's logits on ``path`` differ from ``want`` (see the module docstring)."""
    import archrun
    from archrun.errors import ArchrunError
    from archrun.plugins import default_plugin_manager
    from archrun.vocab import build_vocabulary

    pm = plugins or default_plugin_manager()
    model = archrun.load(path, backend="reference", plugins=pm, hints=hints)
    got, stated = trace(model, ids)
    found = first_diff(got, want, tolerance)
    if found is None:
        return f"the reference backend matches {reference_name} (only the other backend differs)"
    p, element = found
    lines = [f"logits first differ from {reference_name} at position {p} (element {list(element)}: "
             f"archrun {got[element]:.6g}, {reference_name} {want[element]:.6g})"]
    vocab = build_vocabulary(pm)
    pre_cap = next((r.out for r in reversed(stated) if r.op == "output"), None)
    skipped: list[Skipped] = []
    for what, d in changes(model.descriptor, vocab, pre_cap, want):
        if isinstance(d, Skipped):
            skipped.append(d)
            continue
        try:
            alt = build(path, d, pm)
            alt_logits, alt_trace = trace(alt, ids)
        except (ArchrunError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            # the op cannot run the layer as described (a parameter or tensor it needs is not there)
            skipped.append(Skipped(what, f"{type(e).__name__}: {e}"))
            continue
        if first_diff(alt_logits, want, tolerance) is None:
            div = first_divergence(stated, alt_trace, tolerance)
            lines.append(f"with {what} archrun matches {reference_name} at every position: the family "
                         f"(or the file) states this convention wrongly")
            if div is not None:
                if div.position is None:  # an op only one run has: where its effect first shows
                    div = attrs.evolve(div, position=p)
                lines.append(f"first diverging op (as stated vs corrected): {div.describe()}")
            break
    else:
        lines.append("no single convention change makes archrun match it (the math of an op, a weight "
                     "layout or a key may be wrong): compare per-op activations with archrun.conformance.trace")
        if skipped:
            lines.append(f"changes not tried ({len(skipped)}; the model cannot take them): "
                         + "; ".join(f"{s.what}: {s.why}" for s in skipped[:6])
                         + ("; ..." if len(skipped) > 6 else ""))
        lines.append(_recovered(path, ids, want, tolerance, pm, hints))
    return "\n".join(lines)


#: Seconds diagnose gives the recovery loop when no single change explains a mismatch.
RECOVERY_BUDGET = 20.0


def _recovered(path: str | Path, ids: Sequence[int], want: np.ndarray, tolerance: float, pm: Any,
               hints: Any) -> str:
    """What the recovery loop (archrun.conformance.recover, the same engine as `archrun recover`) finds
    from the reference's logits alone, starting from the conventions as stated."""
    from archrun.conformance.recover import hint_dict, recover
    from archrun.conformance.trace_format import Trace
    from archrun.describe.compile import compile_gguf
    from archrun.errors import ArchrunError, NotRecovered

    reference = Trace(np.asarray(ids, np.int64), np.asarray(want, np.float32), {}, "reference")
    try:
        start = compile_gguf(path, pm, hints=hints).hints
        found = recover(path, reference, plugins=pm, tolerance=tolerance, budget=RECOVERY_BUDGET,
                        start=attrs.evolve(start, caller=frozenset()))
    except NotRecovered as e:
        return f"the recovery loop finds no combination of conventions either: {e}"
    except ArchrunError as e:
        return f"the recovery loop could not run: {type(e).__name__}: {e}"
    stated = hint_dict(start)
    changed = {k: v for k, v in hint_dict(found.hints).items() if stated.get(k) != v}
    return ("the recovery loop makes archrun match with the conventions "
            + ", ".join(f"{k}={v!r}" for k, v in changed.items())
            + f" ({found.evaluations} traced runs, {found.seconds:.1f} s)")
