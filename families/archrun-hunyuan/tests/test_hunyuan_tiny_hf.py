"""archrun-hunyuan's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestHunyuan(TinyHfBattery):
    entry_point = "hunyuan-dense"
