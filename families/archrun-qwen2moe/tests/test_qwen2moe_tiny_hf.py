"""archrun-qwen2moe's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestQwen2moe(TinyHfBattery):
    entry_point = "qwen2moe"
