"""archrun's fuzzing harness: hostile GGUF files, tokenizers, chat templates, API and CLI calls.

Each case is a JSON-able dict drawn by hypothesis (`cases.CASES`); a worker process (`worker.py`)
runs it under a time limit and an address-space limit, and the runner (`runner.py`) classifies
what happened: success, a typed `archrun.ArchrunError`, an untyped exception, a crash (signal),
a hang, or an exhausted memory limit. Anything but the first two is a finding.

    .venv/bin/python tests/fuzzing --cases 20000 --seed 1        # the long run (docs/testing.md)
    .venv/bin/python tests/fuzzing --replay findings/<case>.json  # one saved case, in-process
"""
