"""archrun-deepseek2's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestDeepseek2(TinyHfBattery):
    entry_point = "deepseek2"
