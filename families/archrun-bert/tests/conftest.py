"""archrun-bert's tests: archrun's conformance kit (docs/conformance.md) on the package's registration
(no synthetic variants: the kit's writer makes decoders; the tiny HF encoders in goldens/ carry the
models, test_embeddings.py checks them against HF)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("bert", synthetic=())
