"""The family's tests: archrun's conformance kit (docs/conformance.md), enabled by the line below.

It writes a synthetic model of each architecture the family describes and checks that it compiles,
survives a JSON round trip, decodes the same through every path (cache, rewind, batch, fused) on
both backends and refuses corrupted files with typed errors. Declare variants with
archrun.conformance.Synthetic; add tiny HF fixtures (hf_arch.py, goldens/) and the kit checks
archrun's logits against HF's. Name further test files uniquely (test_<family>_*.py).
"""

archrun_conformance = "myfamily"  # the package's archrun entry-point name
