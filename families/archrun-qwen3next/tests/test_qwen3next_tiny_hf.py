"""archrun-qwen3next's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestQwen3Next(TinyHfBattery):
    entry_point = "qwen3next"
