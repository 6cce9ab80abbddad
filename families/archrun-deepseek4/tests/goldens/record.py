"""Record archrun-deepseek4's tiny-fixture goldens into this folder (``--only NAME ...``, ``--llamacpp-check``).

See ``archrun.conformance.hf.record_here`` and docs/testing.md.
"""

from archrun.conformance import hf

if __name__ == "__main__":
    hf.record_here(__file__)
