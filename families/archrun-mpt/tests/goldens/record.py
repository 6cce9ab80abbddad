"""Record archrun-mpt's tiny-fixture goldens (HF transformers float32) into this folder.

    .venv/bin/python families/archrun-mpt/tests/goldens/record.py [--only NAME ...]
    <venv with llama-cpp-python + archrun>/bin/python families/archrun-mpt/tests/goldens/record.py --llamacpp-check

The fixtures are in ../hf_arch.py; conversion is llama.cpp's own converter
(``python -m archrun.conformance.llamacpp`` fetches it); the rest is ``archrun.conformance.hf.record_main``.
"""

from pathlib import Path

from archrun.conformance import hf

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    spec = hf.load_module(HERE.parent / "hf_arch.py")
    hf.record_main(spec.ARCHES, spec.FIXTURES, HERE)
