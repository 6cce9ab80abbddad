"""archrun-qwen35's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestQwen35(TinyHfBattery):
    entry_point = "qwen35"
