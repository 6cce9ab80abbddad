"""archrun-blocks' tests: archrun's conformance kit (docs/conformance.md) on every op it registers
(registration; each fast op = its reference on random, ragged and extreme inputs, op by op and through
its kernel part). The models using the ops are the families'."""

import numpy as np

from archrun.conformance import Conformance
from archrun.conformance.ops import close

F32 = np.float32


def drive_gated(label, reference_factory, fast_factory):
    """A gated-only activation (swiglu_oai: its part reads up itself, SIGNATURES["gated"]): the kit's activation
    cases with up given, strided views, values beyond the clamps and exp's range, and the kernel part on a row."""
    ref, fast = reference_factory(), fast_factory()
    rng = np.random.default_rng(23)
    for shape in [(0, 5), (1, 1), (3, 17), (6, 96), (2, 1001), (2, 3, 5)]:
        g, u = (rng.standard_normal(shape) * 6).astype(F32), (rng.standard_normal(shape) * 6).astype(F32)
        close(label, f"x{list(shape)} gated", fast(g, u), ref(g, u))
    wide = (rng.standard_normal((6, 40)) * 8).astype(F32)
    g, u = wide[::2, 1::3], wide[1::2, 2::3]
    close(label, "strided (not contiguous)", fast(g, u), ref(g, u))
    edges = np.array([-3e38, -1e4, -88.0, -60.0, -7.0, -0.0, 0.0, 1e-40, 6.999, 7.0, 7.001, 88.0, 3e38], F32)
    for name, up in (("up in range", np.full_like(edges, 0.5)), ("up beyond the clamp", edges[::-1].copy())):
        close(label, f"extreme gates, {name}", fast(edges, up), ref(edges, up))
    p = fast.fused
    g, u = (rng.standard_normal(97) * 6).astype(F32), (rng.standard_normal(97) * 6).astype(F32)
    out = np.full_like(g, np.nan)
    p.fn(p.params, g, u, out)
    close(label, "kernel part, random row", out, ref(g, u))


archrun_conformance = Conformance("blocks", op_drivers={"activation=swiglu_oai": drive_gated}, op_specs={
    # xIELU's raw per-layer parameters (alpha_n, alpha_p, beta, eps), as files store them: HF's initial
    # values, a wide eps, and softplus's linear branch (raw values above 20)
    "activation=xielu": [
        {},
        dict(alpha_n=0.7, alpha_p=-2.0, beta=0.8, eps=-0.5),
        dict(alpha_n=25.0, alpha_p=21.0, beta=0.3, eps=-1e-6),
    ],
})
