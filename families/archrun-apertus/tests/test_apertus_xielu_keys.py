"""What the kit cannot know about apertus: each layer's xIELU parameters come from the file's
`xielu.*` keys (one value per layer, or one for all), and a file whose keys are missing, of the wrong
length or not finite is refused with a typed error at compile time, before any kernel runs."""

import re
from pathlib import Path

import gguf
import numpy as np
import pytest

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.hf import rel_err
from archrun.describe.compile import describe
from archrun.errors import MetadataError

FIXTURE = Path(__file__).parent / "goldens" / "apertus_3layer_8head.gguf"
KEYS = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")


def _stored() -> dict[str, list[float]]:
    r = gguf.GGUFReader(str(FIXTURE))
    return {k: [float(x) for x in r.fields[k].contents()] for k in KEYS}


def test_each_layer_reads_its_own_parameters():
    stored = _stored()
    for i, layer in enumerate(describe(FIXTURE).layers):
        got = dict(layer.ffn.activation_params)
        assert got == {k.split(".")[1]: pytest.approx(v[i]) for k, v in stored.items()}


def test_layers_swapping_parameters_move_the_logits(tmp_path):
    stored = _stored()
    swapped = rewrite_gguf(FIXTURE, tmp_path / "swapped.gguf", add_keys={k: v[::-1] for k, v in stored.items()})
    with np.load(FIXTURE.with_suffix(".npz")) as z:
        ids, ref = z["ids"][:12].astype(np.int64), z["logits"][:12]
    assert rel_err(archrun.load(FIXTURE, backend="reference").logits(ids), ref) <= 1e-4
    assert rel_err(archrun.load(swapped, backend="reference").logits(ids), ref) > 1e-2


def test_one_value_serves_every_layer(tmp_path):
    path = rewrite_gguf(FIXTURE, tmp_path / "scalar.gguf", add_keys={"xielu.beta": 0.25})
    assert {dict(ly.ffn.activation_params)["beta"] for ly in describe(path).layers} == {0.25}


@pytest.mark.parametrize("edit, message", [
    (dict(drop_keys=["xielu.alpha_p"]), "missing required metadata key 'xielu.alpha_p'"),
    (dict(add_keys={"xielu.alpha_n": [0.1, 0.2]}), "'xielu.alpha_n' must be a number or 3 numbers"),
    (dict(add_keys={"xielu.eps": [-1e-6, float("nan"), -1e-6]}), "'xielu.eps' holds a value that is not a finite"),
    (dict(add_keys={"xielu.beta": float("inf")}), "'xielu.beta' = inf is not a finite number"),
], ids=["missing", "wrong_length", "nan", "inf"])
def test_bad_xielu_keys_are_refused(tmp_path, edit, message):
    path = rewrite_gguf(FIXTURE, tmp_path / "bad.gguf", **edit)
    with pytest.raises(MetadataError, match=re.escape(message)):
        describe(path)
