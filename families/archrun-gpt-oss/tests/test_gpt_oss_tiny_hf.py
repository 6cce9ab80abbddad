"""archrun-gpt-oss's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestGptOss(TinyHfBattery):
    entry_point = "gpt-oss"
