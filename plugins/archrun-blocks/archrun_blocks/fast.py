"""Fast factories of the core vocabulary, backed by archrun.kernels (numba).

Each factory has the same contract as its reference twin in archrun_blocks.reference; the
conformance kit checks them against each other. Until a kernel exists for a slot the
reference is used (Op.fast is None).
"""

from __future__ import annotations

from archrun_blocks import reference

rms_norm = None
rope_neox = None
rope_norm = None
causal_attention = None
swiglu = None
geglu_tanh = None
_ = reference
