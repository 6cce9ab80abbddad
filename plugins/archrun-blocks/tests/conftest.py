"""archrun-blocks' tests: archrun's conformance kit (docs/conformance.md) on every op it registers
(registration; each fast op = its reference on random, ragged and extreme inputs, op by op and through
its kernel part). The models using the ops are the families'."""

import numpy as np

from archrun.conformance import Conformance

F32 = np.float32


archrun_conformance = Conformance("blocks", op_specs={
    # xIELU's raw per-layer parameters (alpha_n, alpha_p, beta, eps), as files store them: HF's initial
    # values, a wide eps, and softplus's linear branch (raw values above 20)
    "activation=xielu": [
        {},
        dict(alpha_n=0.7, alpha_p=-2.0, beta=0.8, eps=-0.5),
        dict(alpha_n=25.0, alpha_p=21.0, beta=0.3, eps=-1e-6),
    ],
})
