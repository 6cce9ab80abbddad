"""Recorded greedy chains: the tokens an independent reference picks greedily from a fixed prompt.

A chain golden holds ``N_CHAIN`` tokens that a reference model (HF transformers float32 for a tiny
HF fixture; the package's own independent forward pass for a synthetic variant that declares one)
picks by argmax, one after the other, from the fixture's first ``N_PROMPT`` ids, with the
reference's top-2 logit gap at each step. archrun must pick the same tokens through its cache (a
prefill, then one-token steps), on both backends.

A near tie ends the compared chain: where the reference's top-2 gap is below ``TIE`` of the
chain's max |logit| (archrun may differ from the reference by ``limits.TOLERANCE`` of max |logit| in
each logit, so a gap under twice that may legitimately resolve the other way), the tokens from
there on are not compared; the message of a failure (or the skip, when the very first step is a
near tie) states where the chain was cut and why.

Recording (``archrun conformance record PACKAGE --chains``) writes ``greedy_chains.json`` into the
``goldens/`` folder: per model its input file's SHA-256, the prompt, the tokens, the gaps, the
reference's name and the versions that computed it. It refuses to record a chain from a
reference that fails the correctness checks (a rebuilt HF model that does not reproduce the
recorded HF logits, or archrun's logits off the reference's): the chain would pin nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archrun.conformance.bithash import file_sha256
from archrun.conformance.limits import N_TOKENS, TOLERANCE

FILE = "greedy_chains.json"
FORMAT = 1
#: the chain covers the fixture's last positions (24-39 of ``limits.N_TOKENS`` = 40), those its HF goldens hold
#: archrun to: a model whose HF code switches behaviour with the sequence length (Phi-3's LongRoPE picks its
#: factors by it; archrun and llama.cpp by the context) is then compared where both agree
N_CHAIN = 16
N_PROMPT = N_TOKENS - N_CHAIN
#: a reference step whose top-2 gap is below TIE x max |logit| (of the chain) is a near tie
TIE = 2 * TOLERANCE


# ------------------------------------------------------------------------------ computing chains


def reference_chain(step: Callable[[list[int]], np.ndarray], prompt: Sequence[int], n: int = N_CHAIN) -> dict:
    """Greedy chain of a reference: ``step(ids) -> logits of the last position [vocab]``."""
    ids, tokens, gaps, peak = [int(t) for t in prompt], [], [], 0.0
    for _ in range(n):
        logits = np.asarray(step(ids), dtype=np.float64)
        top2 = np.sort(logits)[-2:]
        t = int(np.argmax(logits))
        tokens.append(t)
        gaps.append(float(top2[1] - top2[0]))
        peak = max(peak, float(np.abs(logits).max()))
        ids.append(t)
    return {"prompt": [int(t) for t in prompt], "tokens": tokens, "top2_gaps": gaps, "max_abs_logit": peak}


def archrun_chain(model: Any, prompt: Sequence[int], n: int) -> list[int]:
    """archrun's greedy chain: the prompt through the cache, then one-token steps (argmax, no stop)."""
    cache = model.init_cache(len(prompt) + n)
    logits = model.forward_step(np.asarray(prompt, np.int64), cache)
    out = []
    for i in range(n):
        out.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = model.forward_step([out[-1]], cache)
    return out


def hf_step(model: Any) -> Callable[[list[int]], np.ndarray]:
    """The last position's float32 logits of an HF model on ids (the whole sequence, no cache)."""
    import torch

    def step(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(torch.tensor([ids], dtype=torch.long)).logits[0, -1].float().numpy()

    return step


# ------------------------------------------------------------------------------ files


def read(goldens: Path) -> dict[str, Any]:
    path = Path(goldens) / FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write(goldens: Path, entries: Mapping[str, Any], versions: Mapping[str, Any]) -> Path:
    """Merge ``entries`` (key -> chain) into ``goldens/greedy_chains.json``; return its path."""
    path = Path(goldens) / FILE
    old = read(goldens).get("chains", {})
    body = {"format": FORMAT, "what": "greedy chains of an independent reference (archrun must pick the same "
            "tokens up to the first near tie)", "n_chain": N_CHAIN, "tie": TIE,
            "chains": dict(sorted({**old, **entries}.items()))}
    body["chains"] = {k: {**v, "versions": dict(v.get("versions", versions))} for k, v in body["chains"].items()}
    text = json.dumps(body, indent=1, sort_keys=True)
    import re

    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    path.write_text(text + "\n")
    return path


def key(source: str, name: str) -> str:
    """``hf/<fixture>`` or ``synthetic/<variant>``."""
    return f"{source}/{name}"


# ------------------------------------------------------------------------------ checking


def compared_length(chain: Mapping[str, Any]) -> tuple[int, str]:
    """(how many tokens of the chain are compared, why fewer than all: the first near tie)."""
    bound = TIE * chain["max_abs_logit"]
    for i, gap in enumerate(chain["top2_gaps"]):
        if gap < bound:
            return i, (f"the reference's top-2 logit gap at chain step {i} is {gap:.3g} < {TIE:g} of max |logit| "
                       f"({bound:.3g}): a near tie ends the compared chain there")
    return len(chain["tokens"]), ""


def check_chain(model: Any, chain: Mapping[str, Any], path: Path, what: str) -> None:
    """archrun's greedy chain on ``path`` = the recorded one up to its first near tie."""
    import pytest

    sha = file_sha256(Path(path))
    assert chain["input_sha256"] == sha, (
        f"{what}: the chain was recorded on another file (sha256 {chain['input_sha256'][:12]}, this one "
        f"{sha[:12]}): re-record: archrun conformance record PACKAGE --chains")
    n, why = compared_length(chain)
    if n == 0:
        pytest.skip(f"{what}: nothing to compare: {why}")
    got = archrun_chain(model, chain["prompt"], n)
    want = list(chain["tokens"][:n])
    if got != want:
        i = next(j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        raise AssertionError(
            f"{what}: greedy chain differs from the {chain['reference']} reference at step {i} (position "
            f"{len(chain['prompt']) + i}): archrun picks {got[i]}, the reference {want[i]} (its top-2 gap there "
            f"{chain['top2_gaps'][i]:.3g}); archrun {got}, reference {want}"
            + (f"; compared {n} of {len(chain['tokens'])} tokens: {why}" if why else ""))


def check_recorded(goldens: Path, source: str, name: str, model: Any, path: Path, what: str) -> None:
    """``check_chain`` for the chain recorded under ``key(source, name)``: skipped when the package has
    recorded no chains at all (``goldens/greedy_chains.json`` missing), failed when this model has none."""
    import pytest

    if not (Path(goldens) / FILE).is_file():
        pytest.skip(f"{what}: no greedy chains recorded ({Path(goldens) / FILE}): archrun conformance record "
                    "PACKAGE --chains records them from the package's independent reference")
    chain = read(goldens).get("chains", {}).get(key(source, name))
    assert chain is not None, (f"{what}: no greedy chain recorded in {Path(goldens) / FILE} "
                               "(archrun conformance record PACKAGE --chains)")
    check_chain(model, chain, path, what)


# ------------------------------------------------------------------------------ recording
