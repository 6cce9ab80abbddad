"""The trace file: per-op activations of one run, named by descriptor path, in one .npz file.

A trace is what ``archrun trace`` writes and what ``archrun diverge`` / ``archrun recover`` read;
any runner can write one (docs/level2.md). The file is a numpy ``.npz`` archive holding:

- ``header``: a JSON document as uint8 bytes: ``{"format": "archrun-trace/1", "producer": ...,
  "model": ..., "ops": [{"name": ..., "key": ..., "shape": [...]}, ...]}``, the ops in execution order;
- ``ids``: the token ids (int64 [n]); ``logits``: the final logits (float32 [n, vocab]);
- one float32 array per op (``key`` in the header), axis 0 the token position.

An op's name is its descriptor path ``<layer>/<op>``: ``<layer>`` is a layer index, ``embed`` or
``head``. The points every producer records (the *aligned* ops) are ``<i>/attn_out`` (the attention
branch after its output projection, before any post-norm), ``<i>/ffn_out`` (the FFN after its down
projection, before any post-norm), ``<i>/block`` (the block's output, the residual stream),
``head/final_norm`` (the normed last hidden states) and ``head/output`` (the output head's product
before any logit scale or softcap). archrun also records each op call as ``<layer>/<slot>=<name>``
(a repeated call gets ``#2``, ``#3``, ...): those align only between two archrun traces.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from archrun.errors import BadTrace

FORMAT = "archrun-trace/1"
#: The ops every producer records, per layer and for the head (see the module docstring).
LAYER_OPS = ("attn_out", "ffn_out", "block")
HEAD_OPS = ("final_norm", "output")


@attrs.frozen
class Trace:
    """One run: token ids, final logits, and op name -> activation (execution order)."""

    ids: np.ndarray = attrs.field(eq=False, repr=False)
    logits: np.ndarray = attrs.field(eq=False, repr=False)
    ops: Mapping[str, np.ndarray] = attrs.field(eq=False, repr=False)
    producer: str = "archrun"
    model: str = ""

    @property
    def names(self) -> list[str]:
        return list(self.ops)

    def aligned(self) -> list[str]:
        """The names of the ops every producer records, in execution order."""
        return [n for n in self.ops if n.split("/", 1)[1] in LAYER_OPS + HEAD_OPS]


def layer_of(name: str) -> int | str:
    """The layer part of an op name: an int for a block, else "embed" or "head"."""
    head = name.split("/", 1)[0]
    return int(head) if head.isdigit() else head


def from_records(ids: Sequence[int], logits: np.ndarray, records: Iterable[Any], model: str = "") -> Trace:
    """A Trace of archrun's ``trace.Record`` list (``archrun.conformance.trace.trace``)."""
    ops: dict[str, np.ndarray] = {}
    for r in records:
        op = "final_norm" if r.layer == "head" and r.op.startswith("norm=") and "head/final_norm" not in ops else r.op
        name = f"{r.layer}/{op}"
        k, base = 2, name
        while name in ops:
            name, k = f"{base}#{k}", k + 1
        ops[name] = np.asarray(r.out, np.float32)
    return Trace(np.asarray(ids, np.int64), np.asarray(logits, np.float32), ops, "archrun", model)


def save(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` to ``path`` (an .npz archive, see the module docstring)."""
    path = Path(path)
    keys = {name: f"op{i}" for i, name in enumerate(trace.ops)}
    header = {"format": FORMAT, "producer": trace.producer, "model": trace.model,
              "ops": [{"name": n, "key": keys[n], "shape": list(a.shape)} for n, a in trace.ops.items()]}
    arrays = {keys[n]: np.asarray(a, np.float32) for n, a in trace.ops.items()}
    with open(path, "wb") as f:  # an open file: numpy adds no ".npz" to the caller's name
        np.savez_compressed(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
                            ids=np.asarray(trace.ids, np.int64), logits=np.asarray(trace.logits, np.float32),
                            **arrays)
    return path


def load(path: str | Path) -> Trace:
    """Read a trace file; BadTrace names what is wrong with one that is not a valid trace."""
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise BadTrace(f"{path}: not an {FORMAT} file (format {header.get('format')!r})")
            ids, logits = np.asarray(z["ids"]), np.asarray(z["logits"], np.float32)
            ops = {op["name"]: np.asarray(z[op["key"]], np.float32) for op in header["ops"]}
    except BadTrace:
        raise
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise BadTrace(f"{path}: not a readable trace file ({type(e).__name__}: {e})") from None
    _check(path, ids, logits, ops)
    return Trace(ids.astype(np.int64), logits, ops, str(header.get("producer", "")), str(header.get("model", "")))


def _check(path: Any, ids: np.ndarray, logits: np.ndarray, ops: Mapping[str, np.ndarray]) -> None:
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise BadTrace(f"{path}: ids must be a non-empty 1-D integer array, got shape {ids.shape} {ids.dtype}")
    if logits.ndim != 2 or len(logits) != len(ids):
        raise BadTrace(f"{path}: logits must be [{len(ids)}, vocab], got {list(logits.shape)}")
    for name, a in ops.items():
        if "/" not in name or a.ndim < 1 or len(a) != len(ids):
            raise BadTrace(f"{path}: op {name!r} must be named <layer>/<op> and have one row per token, "
                           f"got shape {list(a.shape)}")
