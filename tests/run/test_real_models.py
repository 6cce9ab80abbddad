"""Real GGUF models (from PyPI packages) against HF transformers float32 and llama.cpp goldens.

Goldens: tests/goldens/real/<model>_{hf,llamacpp}.npz, recorded by tests/goldens/record_real.py
on the token ids of <model>_prompts.json. Per position they hold the top-64 logits, 1024 fixed
vocabulary columns, max/min and the top-1/top-2 margin; per prompt a 16-token greedy chain.

Tolerances (see docs/testing.md):
- HF (exact float32 dequantization): the reference backend must be within 1e-3 of the logit
  range at every stored entry, give the same argmax at every position, and the same 16-token
  greedy chains.
- llama.cpp (quantizes activations to 8 bits inside its matmuls, ~1-2 logits off): argmax equal
  wherever llama.cpp's margin exceeds 1.0; greedy chains equal up to the first step whose margin
  is below 1.0. The fast backend, which quantizes activations the same way, is held to these
  llama.cpp-style bounds against both references.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.models import GOLDENS, real_model

import archrun

REAL = GOLDENS / "real"
MODELS = ("smollm2", "qwen25", "gemma3")
TOL = 1e-3          # fraction of the logit range
MARGIN = 1.0        # llama.cpp near-tie threshold (logits)


def _golden(model: str, ref: str) -> tuple[dict, dict]:
    spec_path, npz_path = REAL / f"{model}_prompts.json", REAL / f"{model}_{ref}.npz"
    if not (spec_path.exists() and npz_path.exists()):
        pytest.skip(f"golden {npz_path.name} not recorded")
    z = np.load(npz_path)
    return json.loads(spec_path.read_text()), {k: z[k] for k in z.files}


class Loaded:
    """One real model's goldens and its archrun models, loaded once per test module per model."""

    def __init__(self, name: str):
        self.name = name
        self._models: dict[str, object] = {}

    def model(self, backend: str):
        if backend not in self._models:
            self._models[backend] = archrun.load(real_model(self.name), backend=backend)
        return self._models[backend]

    def golden(self, ref: str) -> tuple[dict, dict]:
        return _golden(self.name, ref)


@pytest.fixture(scope="module", params=MODELS)
def real(request):
    """Parametrized per model at module scope, so pytest groups the tests by model (one load each)."""
    return Loaded(request.param)


def _stored(logits: np.ndarray, g: dict, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Our logits at the golden's stored entries (top-64 ids + fixed columns) and the golden's values."""
    ids = np.concatenate([g[f"{prefix}.top_ids"], np.broadcast_to(g["cols"], (len(logits), len(g["cols"])))], 1)
    ref = np.concatenate([g[f"{prefix}.top_logits"], g[f"{prefix}.cols_logits"]], 1)
    return np.take_along_axis(logits, ids.astype(np.int64), 1), ref


def _greedy(model, ids: list[int], n: int) -> list[int]:
    cache = model.init_cache(len(ids) + n)
    logits, out = model.forward_step(ids, cache), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        if len(out) < n:
            logits = model.forward_step([out[-1]], cache)
    return out


def _agree_until_near_tie(ours: list[int], ref: np.ndarray, margins: np.ndarray) -> None:
    for step, (a, b, m) in enumerate(zip(ours, ref.tolist(), margins.tolist(), strict=True)):
        if m < MARGIN:
            return  # the reference itself is at a near-tie: later steps may legitimately diverge
        assert a == b, f"greedy step {step}: {a} != {b} (reference margin {m:.2f})"


def test_reference_backend_matches_hf(real):
    spec, g = real.golden("hf")
    model = real.model("reference")
    for prompt, p in spec["prompts"].items():
        logits = model.logits(p["ids"])
        got, ref = _stored(logits, g, prompt)
        span = g[f"{prompt}.max"] - g[f"{prompt}.min"]
        err = np.abs(got - ref).max(axis=1) / span
        assert err.max() <= TOL, f"{prompt}: max error {err.max():.2e} of the logit range"
        # identical argmax at every position (HF margins go down to ~0.01 logit here; measured: 0 flips)
        np.testing.assert_array_equal(logits.argmax(1), g[f"{prompt}.top_ids"][:, 0])


def test_reference_greedy_chains_match_hf(real):
    spec, g = real.golden("hf")
    model = real.model("reference")
    for prompt, p in spec["prompts"].items():
        if len(p["ids"]) > 200:
            continue  # the long gemma prompt is checked position by position above
        ref = g[f"{prompt}.greedy_ids"].tolist()
        assert _greedy(model, p["ids"], len(ref)) == ref, prompt


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_argmax_matches_llamacpp_away_from_near_ties(real, backend):
    spec, g = real.golden("llamacpp")
    model = real.model(backend)
    for prompt, p in spec["prompts"].items():
        logits = model.logits(p["ids"])
        clear = g[f"{prompt}.margin"] > MARGIN
        np.testing.assert_array_equal(logits.argmax(1)[clear], g[f"{prompt}.top_ids"][clear, 0])
        if len(p["ids"]) <= 200:
            ref = g[f"{prompt}.greedy_ids"]
            _agree_until_near_tie(_greedy(model, p["ids"], len(ref)), ref, g[f"{prompt}.greedy_margin"])


def test_fast_backend_matches_hf_away_from_near_ties(real):
    spec, g = real.golden("hf")
    model = real.model("fast")
    for prompt, p in spec["prompts"].items():
        logits = model.logits(p["ids"])
        clear = g[f"{prompt}.margin"] > MARGIN
        np.testing.assert_array_equal(logits.argmax(1)[clear], g[f"{prompt}.top_ids"][clear, 0])


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_no_cache_prefill_and_stepwise_agree(real, backend):
    spec, _ = real.golden("hf")
    model = real.model(backend)
    ids = next(iter(spec["prompts"].values()))["ids"][:40]
    full = model.logits(ids)
    cache = model.init_cache(len(ids))
    prefill = model.forward_step(ids[:24], cache, all_logits=True)
    steps = [model.forward_step([t], cache) for t in ids[24:]]
    ours = np.concatenate([prefill, np.stack(steps)])
    span = full.max(axis=1) - full.min(axis=1)
    err = (np.abs(ours - full).max(axis=1) / span).max()
    if backend == "reference":
        assert err <= TOL
    else:  # decode quantizes activations to 8 bits, prefill does not: llama.cpp-style bounds
        top2 = np.sort(full, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > MARGIN
        np.testing.assert_array_equal(ours.argmax(1)[clear], full.argmax(1)[clear])
        assert err <= 0.1


def test_chat_greedy_generation_matches_references(real):
    if real.name == "gemma3":
        pytest.skip("the Gemma 3 file carries no chat template; see test_gemma3_run_and_chat")
    spec, hf = real.golden("hf")
    _, lc = real.golden("llamacpp")
    model = real.model("reference")
    assert len(spec["chat_prompts"]) >= 3
    for i, chat in enumerate(spec["chat_prompts"]):
        ref = hf[f"chat{i}.greedy_ids"].tolist()
        gen = archrun.generate(model, chat["ids"], max_tokens=len(ref), temperature=0.0).complete()
        ours = list(gen.token_ids)
        assert ours == ref[: len(ours)], f"chat {i}"
        if len(ours) < len(ref):  # stopped early: HF's next token must end generation too
            assert gen.finish_reason == "stop" and ref[len(ours)] in model.tokenizer.eog_ids
        _agree_until_near_tie(ours, lc[f"chat{i}.greedy_ids"][: len(ours)], lc[f"chat{i}.greedy_margin"][: len(ours)])


@pytest.mark.parametrize("command", ["run", "chat"])
def test_gemma3_run_and_chat_follow_the_hf_greedy_chain(command, capsys, monkeypatch):
    """`archrun run --chat` / `archrun chat` on Gemma 3 (family default template) reproduce HF's greedy ids."""
    import io

    from archrun.cli import main

    spec, hf = _golden("gemma3", "hf")
    question = spec["chat_prompts"][0]["conversation"][-1]["content"]
    ref = hf["chat0.greedy_ids"].tolist()
    opts = ["--backend", "reference", "--temp", "0", "-n", str(len(ref))]
    path = str(real_model("gemma3"))
    if command == "run":
        assert main(["run", path, "--chat", "-p", question, *opts]) == 0
    else:
        monkeypatch.setattr("sys.stdin", io.StringIO(question + "\n"))
        assert main(["chat", path, *opts]) == 0
    tok = archrun.Tokenizer.from_gguf(path)
    eog = next((i for i, t in enumerate(ref) if t in tok.eog_ids), len(ref))
    assert capsys.readouterr().out == tok.decode(ref[:eog]) + "\n"
