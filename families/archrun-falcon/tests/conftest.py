"""archrun-falcon's tests: archrun's conformance kit (docs/conformance.md) on a synthetic falcon model
(LayerNorms with biases; the attention's and the FFN's norms as the 40B files store them) and, through
hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("falcon", synthetic=[Synthetic("falcon", "falcon", norm_key="layer")])
