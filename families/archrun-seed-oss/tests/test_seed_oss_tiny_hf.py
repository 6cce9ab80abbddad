"""archrun-seed-oss's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestSeedOss(TinyHfBattery):
    entry_point = "seed_oss"
