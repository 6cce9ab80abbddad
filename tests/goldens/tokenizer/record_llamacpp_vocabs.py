"""Record llama.cpp's tokenization of its own test vocabularies (``models/ggml-vocab-*.gguf``).

Four of them (aquila, baichuan, gpt-neox, nomic-bert-moe) ship without ``.inp``/``.out`` pairs;
this records llama.cpp's ids for every one of the 19 files on a shared corpus: all ``.inp`` test
strings plus the edge cases of record_llamacpp.py, with add_special off and on. Run with a venv
that has llama-cpp-python (vocab only -- nothing is evaluated):

    /work/bench-venv/bin/python tests/goldens/tokenizer/record_llamacpp_vocabs.py

Writes tests/goldens/tokenizer/llamacpp_vocabs.json (each vocabulary's SHA-256 is stored so a
different file is noticed).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = Path.home() / ".cache" / "archrun" / "llama.cpp" / "0.3.36" / "models"
SEPARATOR = "\n__ggml_vocab_test__\n"


def corpus() -> list[str]:
    """Every .inp test string (file order, deduplicated), then record_llamacpp.py's edge cases."""
    sys.path.insert(0, str(HERE))
    from record_llamacpp import EDGE_CASES

    texts: list[str] = []
    for inp in sorted(SOURCE.glob("ggml-vocab-*.gguf.inp")):
        raw = inp.read_bytes().decode("utf-8")
        parts = raw.split(SEPARATOR)
        texts.extend(parts[:-1] if raw.endswith(SEPARATOR) else parts)
    texts.extend(EDGE_CASES)
    return list(dict.fromkeys(texts))


def record(path: Path, texts: list[str]) -> dict:
    """ids of every text with add_special off and on (parse_special off, as test-tokenizer-0)."""
    from llama_cpp import Llama

    llm = Llama(str(path), vocab_only=True, verbose=False)
    plain = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]
    special = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in texts]
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "plain": plain, "add_special": special}


def main() -> None:
    import llama_cpp

    texts = corpus()
    vocabs = {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf"): record(p, texts)
              for p in sorted(SOURCE.glob("ggml-vocab-*.gguf"))}
    out = {"llama_cpp_python": llama_cpp.__version__, "recorded": dt.date.today().isoformat(),
           "texts": texts, "vocabs": vocabs}
    (HERE / "llamacpp_vocabs.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n",
                                               encoding="utf-8")
    print(f"{len(vocabs)} vocabularies x {len(texts)} texts")


if __name__ == "__main__":
    main()
