"""archrun-mamba2's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestMamba2(TinyHfBattery):
    entry_point = "mamba2"
