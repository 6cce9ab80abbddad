"""archrun.generation.fingerprint: the hashes of every step's logits a generation reports, and the system
fingerprint."""

from __future__ import annotations

import numpy as np
import pytest
from support.models import real_model

import archrun
from archrun.cli import main
from archrun.errors import InvalidRequest
from archrun.generation.fingerprint import fnv1a64, system_fingerprint


@pytest.fixture(scope="module")
def model():
    return archrun.load(real_model("smollm2"))


def test_fnv1a64_is_the_published_function():
    assert fnv1a64(np.frombuffer(b"abcd", "<f4")) == "fc179f83ee0724dd"  # FNV-1a 64 of b"abcd"


def test_generation_hashes_are_the_hashes_of_its_steps_logits(model):
    ids = model.tokenizer.encode("Water boils at")
    r = archrun.generate(model, ids, max_tokens=5, temperature=0, logit_hashes=True).complete()
    cache = model.init_cache(64)
    want, logits = [], model.forward_step(ids, cache)
    for t in r.token_ids:
        want.append(fnv1a64(logits))
        assert int(np.argmax(logits)) == t
        logits = model.forward_step([t], cache)
    assert list(r.logit_hashes[:len(want)]) == want
    assert len(r.logit_hashes) == len(r.token_ids) + (r.finish_reason == "stop")
    again = archrun.generate(model, ids, max_tokens=5, temperature=0, logit_hashes=True).complete()
    assert again.logit_hashes == r.logit_hashes
    assert archrun.generate(model, ids, max_tokens=2, temperature=0).complete().logit_hashes is None
    with pytest.raises(InvalidRequest):
        archrun.generate(model, ids, max_tokens=2, logit_hashes="yes")


def test_fingerprint_names_the_file_and_backend(model):
    fp = system_fingerprint(model)
    assert fp == system_fingerprint(model) and fp.startswith("fp_")
    other = archrun.load(real_model("smollm2"), backend="reference")
    assert system_fingerprint(other) != fp


def test_cli_hash_prints_the_same_hashes_on_every_run(capsys):
    argv = ["run", str(real_model("smollm2")), "-p", "Snow is", "-n", "4", "--temp", "0", "--hash"]
    assert main(argv) == 0
    first = capsys.readouterr().err
    assert main(argv) == 0
    second = capsys.readouterr().err
    lines = [ln for ln in first.splitlines() if ln.startswith(("system_fingerprint:", "logit_hashes:"))]
    assert len(lines) == 2 and lines == [ln for ln in second.splitlines() if ln.startswith(("system_", "logit_"))]
    assert len(lines[1].split()) >= 5  # 4 tokens, and the step that ended it when it stopped
