"""archrun-hash-moe's tests: archrun's conformance kit (docs/conformance.md) on its op. `hash_topk` is called
with the rows' token ids and binds its layer's table, so a driver runs it: HF's hash and top-k layers
(hash_moe_case.py) through both factories, a prompt's rows and single rows."""

import sys
from pathlib import Path

import numpy as np

from archrun.conformance import Conformance
from archrun.conformance.ops import close

sys.path.insert(0, str(Path(__file__).parent))


def drive_hash_topk(label: str, reference, fast) -> None:
    from hash_moe_case import D, V, hf_block, op, weights

    rng = np.random.default_rng(7)
    x, ids = (rng.standard_normal((13, D)) * 2).astype(np.float32), rng.integers(0, V, 13)
    for hash_layer in (True, False):
        b = hf_block(hash_layer)
        want = op(reference, b, "reference")(x, weights(b, "reference"), ids)
        got_op, w = op(fast, b, "fast"), weights(b, "fast")
        kind = "hash" if hash_layer else "topk"
        close(label, f"{kind} layer, 13 rows", got_op(x, w, ids), want)
        close(label, f"{kind} layer, one row", got_op(x[5:6], w, ids[5:6]), want[5:6])


archrun_conformance = Conformance("hash-moe", op_drivers={"moe=hash_topk": drive_hash_topk})
