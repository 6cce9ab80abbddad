"""Record llama.cpp's tokenization of its own test vocabularies (``models/ggml-vocab-*.gguf``).

The files with ``.inp``/``.out`` pairs are checked against those (tests/text/test_tokenizer_llamacpp_vocabs.py);
this covers the rest and the vocabulary kinds archrun added last: aquila and gpt-neox (gpt2 without
``tokenizer.ggml.pre`` -> llama.cpp's 'default'), baichuan (SPM), bert-bge (WPM), gemma-4 (gemma4)
and nomic-bert-moe (UGM). Corpus: every ``.inp`` test string plus record_llamacpp.py's corpus (edge
cases and seeded random strings). Per text: ids with (add_special, parse_special) in {off/off,
on/off, off/on} and llama_detokenize of the add_special ids, keeping and removing special tokens.
A second, smaller "stress" corpus (seeded random strings heavy in control characters, non-ASCII
whitespace, combining marks and special-token texts) is tokenized by all 19 files (ids only),
and -- for pre-tokenizers no test vocabulary uses -- by copies of ggml-vocab-gpt-2 (ggml-vocab-gemma-4
for the SPM-style sarvam-moe) whose `tokenizer.ggml.pre` names them (PRE_VARIANTS).
Run with a venv that has llama-cpp-python (vocab only -- nothing is evaluated):

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
VOCABS = ("aquila", "baichuan", "bert-bge", "gemma-4", "gpt-neox", "nomic-bert-moe")


def corpus() -> list[str]:
    """Every .inp test string (file order, deduplicated), then record_llamacpp.py's corpus."""
    sys.path.insert(0, str(HERE))
    from record_llamacpp import corpus as model_corpus

    texts: list[str] = []
    for inp in sorted(SOURCE.glob("ggml-vocab-*.gguf.inp")):
        raw = inp.read_bytes().decode("utf-8")
        parts = raw.split(SEPARATOR)
        texts.extend(parts[:-1] if raw.endswith(SEPARATOR) else parts)
    texts.extend(model_corpus())
    return list(dict.fromkeys(texts))


STRESS_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " " * 10, "\n\t\r\x0b\x0c",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "äöüßéèêçñøåÆŒİıſǅ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюяЁЖ",
    "的一是不了人我在有他这为之大来以个中上们𠀀𪚥", "あいうえおかきくけこアイウエオｱｲｳ", "가나다라마바사아자차ㄱㄴ",
    "αβγδεζηθικλμνξοπρστυφχψωΣς", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "अआइईउऊऋएऐओऔकखगघ\u093f\u094d",
    "😀🚀👍🏽❤️🎉🔥✨\u200d", "\u00a0\u2009\u3000\u200b\u200d\u0301\u0308\u2028\u2029\u0085\u1680\ufeff",
    "—–…«»“”‘’•·€£¥©®™°±×÷", "\x00\x01\x07\x1f\x7f\ufffd\ue000", "▁", "ﬁﬂ①②Ⅻ½²³ｍＡ", "ŉǰΐ",
    "<s></s><unk><pad>[CLS][SEP][UNK][MASK]<bos><eos><mask>",
]


# non-ASCII whitespace next to letters and CJK/punctuation ranges (llama.cpp's std::wregex path),
# bytes some vocabularies lack between mergeable neighbours (falcon has no \x0b token)
STRESS_FIXED = [
    "a\u2009s", "\u2581\u2009s", "\u3000\u3000x", "  \u3000\u200d\u2009 \u3000\u0308\u2009  ", "x\u1680y\u2028z",
    "\u00a0\u00a0\u3000", "\t\x0b\t", "\n\t\x0b\t\x0c\n", "\r\x0b\r\n\x0b\n", "a\x03b\x1ec\xc0d",
]


# pre-tokenizer -> the test vocabulary its copy is made from (model set to gpt2)
PRE_VARIANTS = {name: "gpt-2" for name in (
    "minicpm5", "exaone-moe", "ufakzeka", "laguna", "spark2_5", "hy_v4", "joyai-llm", "jais-2",
    "granite-embed-multi-97m", "youtu", "chameleon", "jina-v2-es", "modern-bert", "roberta-bpe",
    "jina-v5-nano", "talkie", "mellum2", "tiny_aya", "cohere2moe", "afmoe", "superbpe", "kimi-k2")}
PRE_VARIANTS["sarvam-moe"] = "gemma-4"


def copy_with_pre(src: Path, dst: Path, pre: str) -> None:
    """`src` with tokenizer.ggml.model = gpt2 and tokenizer.ggml.pre = `pre` (every other key kept)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "tokenizer.ggml.pre"):
            continue
        value = "gpt2" if key == "tokenizer.ggml.model" else field.contents()
        if field.types[0] == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
            writer.add_array(key, value)
        elif field.types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, field.types[0])
    writer.add_string("tokenizer.ggml.pre", pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def stress_corpus(n: int = 80, seed: int = 99) -> list[str]:
    """STRESS_FIXED, then seeded random strings drawn from 1-4 of STRESS_POOLS, 1-60 characters."""
    import random

    rng = random.Random(seed)
    texts = list(STRESS_FIXED)
    for _ in range(n):
        pools = rng.sample(STRESS_POOLS, rng.randint(1, 4))
        texts.append("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 60))))
    return texts


def detokenize(llama_cpp, vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> str | dict:
    """llama_detokenize -> the text, or {"hex": ...} when the bytes are not valid UTF-8."""
    from record_llamacpp import detokenized_bytes  # this folder's llama.cpp recorder

    raw = detokenized_bytes(llama_cpp, vocab, ids, remove_special, unparse_special)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": raw.hex()}


def record(path: Path, texts: list[str]) -> dict:
    """Per text: ids for three (add_special, parse_special) settings and two detokenizations."""
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out: dict[str, list] = {"plain": [], "add_special": [], "parse_special": [], "detok": [], "detok_skip": []}
    for text in texts:
        data = text.encode("utf-8")
        out["plain"].append(llm.tokenize(data, add_bos=False, special=False))
        out["add_special"].append(ids := llm.tokenize(data, add_bos=True, special=False))
        out["parse_special"].append(llm.tokenize(data, add_bos=False, special=True))
        out["detok"].append(detokenize(llama_cpp, vocab, ids, False, True))
        out["detok_skip"].append(detokenize(llama_cpp, vocab, ids, True, False))
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), **out}


def record_pre_variants(texts: list[str]) -> dict:
    """{pre: {"base": test vocabulary, "sha256": its hash, "plain": ids of `texts`}}."""
    import tempfile

    from llama_cpp import Llama

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre, base in PRE_VARIANTS.items():
            src = SOURCE / f"ggml-vocab-{base}.gguf"
            dst = Path(tmp) / f"{pre}.gguf"
            copy_with_pre(src, dst, pre)
            llm = Llama(str(dst), vocab_only=True, verbose=False)
            out[pre] = {"base": base, "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                        "plain": [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]}
            del llm
    return out


def main() -> None:
    import llama_cpp
    from llama_cpp import Llama

    texts = corpus()
    vocabs = {name: record(SOURCE / f"ggml-vocab-{name}.gguf", texts) for name in VOCABS}
    stress = stress_corpus()
    stressed = {}
    for path in sorted(SOURCE.glob("ggml-vocab-*.gguf")):
        llm = Llama(str(path), vocab_only=True, verbose=False)
        stressed[path.name.removeprefix("ggml-vocab-").removesuffix(".gguf")] = {
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "plain": [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in stress]}
    out = {
        "llama_cpp_python": llama_cpp.__version__, "recorded": dt.date.today().isoformat(),
        "calls": {"plain": "Llama.tokenize(text, add_bos=False, special=False)",
                  "add_special": "Llama.tokenize(text, add_bos=True, special=False)",
                  "parse_special": "Llama.tokenize(text, add_bos=False, special=True)",
                  "detok": "llama_detokenize(add_special ids, remove_special=False, unparse_special=True)",
                  "detok_skip": "llama_detokenize(add_special ids, remove_special=True, unparse_special=False)",
                  "note": "detokenized bytes that are not valid UTF-8 are stored as {\"hex\": ...}"},
        "texts": texts, "vocabs": vocabs, "stress_texts": stress, "stress": stressed,
        "pre_variants": record_pre_variants(stress[:40]),
    }
    (HERE / "llamacpp_vocabs.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n",
                                               encoding="utf-8")
    print(f"{len(vocabs)} vocabularies x {len(texts)} texts")


if __name__ == "__main__":
    main()
