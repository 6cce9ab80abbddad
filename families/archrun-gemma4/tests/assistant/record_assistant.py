"""Record the ``gemma4-assistant`` drafter's goldens into ``goldens/`` (see ``assistant_fixture.py``).

    .venv/bin/python families/archrun-gemma4/tests/assistant/record_assistant.py

Needs torch, transformers and llama.cpp's converter (``python -m archrun.conformance.llamacpp``).
"""

from pathlib import Path

from archrun.conformance import hf

if __name__ == "__main__":
    fixture = hf.load_module(Path(__file__).resolve().parent / "assistant_fixture.py")
    print("wrote", fixture.record())
