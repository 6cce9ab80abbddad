"""Mutation test of the conformance kit on this package: flip one convention the family states at a time (rope
pairing, norm unit offset, activation, router renormalisation, softcap) and run the kit (conftest.py) in-
process; exactly the kit's comparisons with the independent reference fail (its logits, each naming the op and
the first diverging position, and possibly its recorded greedy chains, naming the first differing step). The
unmutated package passes every kit test."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType

import attrs
import pytest

from archrun_example_vocab import plugin as example

HERE = Path(__file__).resolve().parent
BOTH = ("quickgelu_dense", "quickgelu_moe")

# convention -> (the change to the family's hints, variants whose reference check must fail, what the message names)
MUTATIONS = {
    "rope_pairing": ({"rope_pairing": "neox"}, BOTH, r"op rope=neox \(other run: rope=norm\) in layer 0, position 1,"),
    "norm_unit_offset": ({"norm": "rms_1p"}, BOTH, r"op norm=rms_1p \(other run: norm=rms\) in layer 0, position 0,"),
    "activation": ({"activation": "silu"}, BOTH,
                   r"op activation=silu \(other run: activation=gelu_quick\) in layer 0, position 0,"),
    "router_renormalisation": ({"moe_weights_norm": False}, ("quickgelu_moe",),
                               r"renormalised=True \(stated: False.*\n.*op moe=topk in layer 1, position 0,"),
    "softcap": ({"defaults": {}}, BOTH,
                r"softcap=tanh at 30 \(stated: none\).*\n.*op softcap=tanh in the output head runs in one model and "
                r"not the other; the logits first differ at position 0"),
}


class _Reports:
    """Collects the outcome of every kit test of an in-process pytest run."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome
            if report.failed:
                self.messages[report.nodeid] = report.longreprtext


def run_kit() -> _Reports:
    reports = _Reports()
    pytest.main([str(HERE), "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                 "-k", "TestArchrunConformance"], plugins=[reports])
    assert reports.outcomes, "the kit ran no test"
    return reports


@pytest.fixture
def mutate(monkeypatch):
    def apply(change: dict) -> None:
        hints = example.HINTS[example.ARCHITECTURE]
        mutated = {example.ARCHITECTURE: attrs.evolve(hints, **change)}
        monkeypatch.setattr(example.plugin, "hints", MappingProxyType(mutated))

    return apply


def test_the_unmutated_package_passes_the_kit():
    reports = run_kit()
    failed = {k: v for k, v in reports.outcomes.items() if v != "passed"}
    assert not failed, "\n\n".join(reports.messages.get(k, v) for k, v in failed.items())
    assert any("test_matches_reference" in k for k in reports.outcomes)


@pytest.mark.parametrize("convention", list(MUTATIONS))
def test_a_flipped_convention_fails_the_reference_check_naming_the_op(convention, mutate):
    change, variants, names = MUTATIONS[convention]
    mutate(change)
    reports = run_kit()
    failed = {k for k, v in reports.outcomes.items() if v != "passed"}
    expected = {k for k in reports.outcomes if "test_matches_reference" in k and any(f"[{v}-" in k for v in variants)}
    # the recorded greedy chains of the reference may also part (where the flip moves an argmax): allowed
    chains = {k for k in reports.outcomes if "test_greedy_chain" in k and any(f"[{v}-" in k for v in variants)}
    assert len(expected) == 2 * len(variants)  # both backends of each variant
    assert expected <= failed <= expected | chains, (
        f"{convention}: failed {sorted(failed)}, expected {sorted(expected)} (and possibly those variants' chains)")
    for nodeid in failed - chains:
        message = reports.messages[nodeid]
        assert "first diverging position" in message and re.search(names, message), f"{nodeid}:\n{message}"
    for nodeid in failed & chains:
        assert "greedy chain differs from the" in reports.messages[nodeid], reports.messages[nodeid]
