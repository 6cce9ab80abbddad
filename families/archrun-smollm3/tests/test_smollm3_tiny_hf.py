"""archrun-smollm3's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestSmolLm3(TinyHfBattery):
    entry_point = "smollm3"
