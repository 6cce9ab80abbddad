"""archrun family plugin for mamba (Mamba and Falcon-Mamba; descriptions only, no math).

What mamba files do not say (llama.cpp src/models/mamba.cpp, HF modeling_mamba.py and
modeling_falcon_mamba.py): every block is norm -> Mamba mixer -> residual (the file has no attention heads,
`attention.head_count` 0, and no FFN tensors), the mixer being "mamba" from the archrun-recurrent vocabulary
package (Falcon-Mamba files, `ssm.dt_b_c_rms` true, add weightless RMS norms on dt, B and C); `ssm_a` and
`ssm_d` are stored without the `.weight` suffix.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "mamba": FamilyHints(name="mamba", embed_scale=1.0, recurrent="mamba",
                         tensor_names={"ssm_a": "blk.{i}.ssm_a", "ssm_d": "blk.{i}.ssm_d"}, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
