"""One fixture's goldens read back (``load_golden``) and an archrun run checked against them
(``check_fixture``, ``rel_err``: the kit's relative error).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from archrun.conformance.limits import TOLERANCE


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to max |ref|."""
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def load_golden(npz: str | Path) -> dict[str, Any]:
    """The arrays of a fixture's .npz, with ``config``/``fixture``/``versions`` decoded from JSON."""
    with np.load(npz, allow_pickle=False) as z:
        out = {k: z[k] for k in z.files}
    for key in ("config_json", "fixture_json", "versions_json"):
        out[key.removesuffix("_json")] = json.loads(str(out.pop(key)))
    return out


def check_fixture(gguf_path: str | Path, backend: str = "reference", tolerance: float = TOLERANCE) -> None:
    """Assert archrun's logits on a fixture match its HF goldens (the .npz beside it).

    Both the whole sequence in one call and token by token through the KV cache, within
    ``tolerance`` of max |logit|.
    """
    import archrun

    gguf_path = Path(gguf_path)
    with np.load(gguf_path.with_suffix(".npz")) as z:
        ids, ref = z["ids"].astype(np.int64), z["logits"]
    assert len(ids) >= 24, f"{gguf_path.name}: only {len(ids)} golden tokens"
    model = archrun.load(gguf_path, backend=backend)
    err = rel_err(model.logits(ids), ref)
    assert err <= tolerance, f"{gguf_path.name} ({backend}): prompt logits off by {err:.2e} of max |logit|"
    cache = model.init_cache(len(ids))
    steps = np.stack([model.forward_step([t], cache) for t in ids])
    err = rel_err(steps, ref)
    assert err <= tolerance, f"{gguf_path.name} ({backend}): cached step logits off by {err:.2e} of max |logit|"
