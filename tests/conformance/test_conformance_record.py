"""`archrun conformance record PACKAGE`: finds a plugin package's fixture declarations; refuses
clearly what it cannot record (recording itself is the live re-record test of each family)."""

from __future__ import annotations

import pytest

from archrun import cli
from archrun.conformance import hf
from archrun.errors import InvalidRequest


def test_finds_the_fixture_declarations_of_an_installed_family():
    found = hf.package_fixture_specs("deepseek2")
    assert [p.name for p in found] == ["hf_arch.py"] and found[0].parent.name == "tests"
    assert (found[0].parent / "goldens").is_dir()
    spec = hf.load_module(found[0])
    assert spec.FIXTURES and spec.ARCHES


def test_a_family_with_fixtures_in_nested_folders_has_each_found():
    found = hf.package_fixture_specs("llama")
    assert len(found) >= 2  # tests/hf_arch.py and tests/llamacpp_converted/hf_arch.py


@pytest.mark.parametrize("package, why", [("no-such-plugin", "no installed archrun plugin"),
                                          ("blocks", "declares no fixtures")])
def test_refuses_what_it_cannot_record(package, why, capsys):
    with pytest.raises(InvalidRequest, match=why):
        hf.package_fixture_specs(package)
    assert cli.main(["conformance", "record", package]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0]
