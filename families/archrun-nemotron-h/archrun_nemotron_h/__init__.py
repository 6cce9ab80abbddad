"""archrun family plugin for nemotron_h (NVIDIA Nemotron-H; descriptions only, no math).

What nemotron_h files do not say (llama.cpp src/models/nemotron-h.cpp, HF modeling_nemotron_h.py):
every block is norm -> one branch -> residual, the branch by the per-layer keys — `head_count_kv` 0
and `feed_forward_length` 0: a Mamba2 mixer ("mamba2", archrun-recurrent: grouped gated RMSNorm;
`ssm_a`/`ssm_d` stored without `.weight`); `head_count_kv` 0 with a feed-forward width: an MLP alone
(no token mixer: archrun-blocks' "no_mixer" in its place, the MLP reading the block's normed input);
otherwise causal attention without rotary embedding (NoPE) and no FFN. The MLP is plain squared ReLU
(down(relu(up x))^2); RMS norms with the file's epsilon; no embedding scale.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

HINTS = {
    "nemotron_h": FamilyHints(name="nemotron_h", rope_pairing="none", activation="relu2", embed_scale=1.0,
                              norm="rms", recurrent="mamba2", mixerless="no_mixer",
                              tensor_names={"ssm_a": "blk.{i}.ssm_a", "ssm_d": "blk.{i}.ssm_d"}, **TRANSFORMER),
}

plugin = FamilyPlugin(HINTS)
