"""archrun-deepseek4-ops's tests: archrun's conformance kit (docs/conformance.md) on its ops. Activation
"swiglu_clamp" takes its limit from the file, so the fast-op check runs on these: DeepSeek-V4's 10, a limit
that clamps most inputs, and none (0: plain SwiGLU). Stream "mhc" binds its own tensors and calls the
block's branches, so a driver runs it: random hyper-connection weights, two layers of stand-in branches,
a prompt and single tokens. Attention "deepseek4" binds tables and takes side inputs: a driver runs its
three layer kinds. MoE "hash_topk" is called with the rows' token ids and binds its layer's table: a driver
runs HF's hash and top-k layers (hash_moe_case.py) through both factories, a prompt's rows and single rows."""

from types import SimpleNamespace

import numpy as np

from archrun.conformance import Conformance
from archrun.conformance.ops import close

F32 = np.float32


class _Tables:
    """A binder over random hyper-connection tensors (numpy order) of `layers` layers, n streams of width d."""

    def __init__(self, n: int, d: int, layers: int, seed: int):
        rng = np.random.default_rng(seed)
        k = (2 + n) * n
        self.t = {}
        for i in range(layers):
            for kind in ("attn", "ffn"):
                self.t[f"{i}.hc_{kind}_fn"] = rng.normal(0, 0.5, (k, n * d)).astype(F32)
                self.t[f"{i}.hc_{kind}_base"] = rng.normal(0, 1, k).astype(F32)
                self.t[f"{i}.hc_{kind}_scale"] = rng.normal(0, 1, 3).astype(F32)
        self.t["output_hc_fn"] = rng.normal(0, 0.5, (n, n * d)).astype(F32)
        self.t["output_hc_base"], self.t["output_hc_scale"] = rng.normal(0, 1, n).astype(F32), np.ones(1, F32)

    def table(self, role, layer=None):
        return self.t[role if layer is None else f"{layer}.{role}"]

    vector = table


class _Block:
    def __init__(self, d: int, seed: int):
        rng = np.random.default_rng(seed)
        self.wa, self.wf = (rng.standard_normal((d, d)).astype(F32) * d ** -0.5 for _ in range(2))

    def attention(self, h):
        return np.tanh(np.asarray(h, F32) @ self.wa) * 2

    def ffn(self, g):
        return np.asarray(g, F32) @ self.wf


def drive_mhc(label: str, reference, fast) -> None:
    for n, d, iters in ((4, 24, 20), (2, 16, 3), (1, 8, 1)):
        desc = SimpleNamespace(n_embd=d, n_layer=2, norm_eps=1e-6)
        x = (np.random.default_rng(n).standard_normal((9, d)) * 2).astype(F32)
        outs = []
        for factory in (fast, reference):
            op = factory(desc, n_stream=float(n), iters=float(iters), hc_eps=1e-6)
            op.bind(_Tables(n, d, 2, seed=d))
            per_case = []
            for rows in (slice(0, 9), slice(4, 5)):
                state = op.enter(x[rows], np.arange(9)[rows])
                for i in range(2):
                    state = op.layer(i, state, _Block(d, i))
                per_case.append(op.leave(state))
            outs.append(per_case)
        for case, got, want in zip(("prompt", "one token"), *outs, strict=True):
            close(label, f"{case} streams={n} width={d} iters={iters}", got, want)


def drive_v4(label: str, reference, fast) -> None:
    """attention=deepseek4 binds its tables and takes side inputs: a sliding, a CSA and an HCA layer on random
    weights (tests/v4_layer.py's geometry), as a prompt, token by token and in chunks."""
    from v4_layer import KINDS, archrun_layer, op_inputs, random_weights, run_op

    n = 29
    for kind, name in enumerate(KINDS):
        w = random_weights(kind, seed=kind)
        layers = [archrun_layer(w, factory) for factory in (fast, reference)]
        x = op_inputs(layers[1], np.random.default_rng(kind).standard_normal((n, 24)).astype(F32))
        want = run_op(layers[1][1], x, [slice(0, n)])
        for what, spans in (("prompt", [slice(0, n)]), ("token by token", [slice(i, i + 1) for i in range(n)]),
                            ("chunks", [slice(0, 3), slice(3, 11), slice(11, n)])):
            close(label, f"{what} {name}", run_op(layers[0][1], x, spans), want)


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


archrun_conformance = Conformance("deepseek4-ops", op_specs={
    "activation=swiglu_clamp": [dict(limit=10.0), dict(limit=0.5), dict(limit=0.0)],
}, op_drivers={"stream=mhc": drive_mhc, "attention=deepseek4": drive_v4, "moe=hash_topk": drive_hash_topk},
    op_deviations={
    "activation=swiglu_clamp": {
        "*extreme values": "archrun-blocks' SiLU part gives x / (1 + e^87) below its exp clamp: -4.9 at "
                           "x = -3.4e38, where the reference gives -0; the clamp keeps every other output "
                           "small, so the kit's relative bound sees it",
    },
})
