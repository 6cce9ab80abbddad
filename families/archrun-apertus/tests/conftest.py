"""archrun-apertus's tests: archrun's conformance kit (docs/conformance.md) on a synthetic apertus model
and, through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("apertus", synthetic=[
    # per-head Q/K norms; each layer's xIELU parameters its own (raw values, as files store them)
    Synthetic("apertus", "apertus", seed=1, qk_norm=True, file_keys={
        "xielu.alpha_n": [-1.2, -0.6], "xielu.alpha_p": [0.2, 0.9], "xielu.beta": [0.5, 0.4],
        "xielu.eps": [-1e-6, -1e-6]}),
])
