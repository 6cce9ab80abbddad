"""A stream op that runs the blocks' branches apart declares `branches` (archrun.contracts): only the stream
slot takes it, and the kit's convention-sensitivity check then leaves the (unused) residual topology out."""

from types import SimpleNamespace

import pytest

from archrun.conformance import tiny_hf
from archrun.contracts import OpCapabilities, check_declaration
from archrun.errors import PluginError


def test_only_stream_ops_declare_branches():
    check_declaration("stream", "s", None, OpCapabilities(branches=True), "p")
    with pytest.raises(PluginError, match="branches"):
        check_declaration("moe", "m", None, OpCapabilities(branches=True), "p")


@pytest.mark.parametrize("branches", [True, False])
def test_residual_is_not_stated_under_a_branch_stream(monkeypatch, branches):
    layer = SimpleNamespace(residual="sequential", ffn=object(), attention=SimpleNamespace(mixer=False))
    d = SimpleNamespace(stream="s", layers=[layer])
    monkeypatch.setattr(tiny_hf, "_stream_caps", lambda name: OpCapabilities(branches=branches))
    assert tiny_hf._stated(d, "residual") == (None if branches else "sequential")
    d.stream = ""
    assert tiny_hf._stated(d, "residual") == "sequential"
