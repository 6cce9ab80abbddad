"""The conformance kit: the standard tests of a plugin package, as a pytest plugin.

A package enables it with one line in its tests' ``conftest.py`` (see docs/conformance.md)::

    archrun_conformance = "myplugin"        # its archrun entry-point name

or declares synthetic variants and an independent reference forward pass::

    from archrun.conformance import Conformance, Synthetic
    archrun_conformance = Conformance("myplugin", synthetic=[Synthetic("dense", "myarch")], reference=forward)

Modules: ``pytest_plugin`` (the ``pytest11`` entry point), ``kit`` (the battery), ``synthetic``
(GGUF variants and corruptions), ``ops`` (fast op = reference), ``trace`` (per-op activations and
the diagnosis of a mismatch), ``tiny_hf`` and ``hf`` (HF goldens), ``llamacpp`` (its converter),
``bithash`` (archrun's own logit bits pinned per machine class: a regression check, not a golden).
Level 2 (docs/level2.md): ``trace_format`` (the trace file), ``hf_trace`` (HF transformers' trace),
``diverge`` (two traces aligned op by op), ``recover`` (the recovery loop), ``package`` (a family
package from a recovery), ``commands`` (`archrun trace | diverge | recover`).
"""

from __future__ import annotations

from archrun.conformance.checks import check_family_plugin, check_vocabulary_plugin

__all__ = ["Conformance", "Synthetic", "check_family_plugin", "check_vocabulary_plugin"]


def __getattr__(name: str):
    # the declaration types, without importing pytest for code that only records goldens
    if name == "Conformance":
        from archrun.conformance.kit import Conformance

        return Conformance
    if name == "Synthetic":
        from archrun.conformance.synthetic import Synthetic

        return Synthetic
    raise AttributeError(name)
