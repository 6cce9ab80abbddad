"""archrun family plugin for mamba2 (descriptions only, no math).

What mamba2 files do not say (llama.cpp src/models/mamba2.cpp, HF modeling_mamba2.py): every block
is norm -> Mamba2 mixer -> residual (the file has no attention heads, `attention.head_count` 0, and
no FFN tensors), the mixer being "mamba2" from the archrun-recurrent vocabulary package; `ssm_a` and
`ssm_d` are stored without the `.weight` suffix.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "mamba2": FamilyHints(name="mamba2", embed_scale=1.0, recurrent="mamba2",
                          tensor_names={"ssm_a": "blk.{i}.ssm_a", "ssm_d": "blk.{i}.ssm_d"}, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
