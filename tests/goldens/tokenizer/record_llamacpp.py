"""Record llama.cpp tokenizer goldens for the real models: tokenize, detokenize, special ids, EOG set.

Run with the reference venv (llama-cpp-python, vocab only -- no weights are evaluated):

    /work/refvenv/bin/python tests/goldens/tokenizer/record_llamacpp.py [smollm2 qwen25 gemma3]

Writes tests/goldens/tokenizer/<model>_llamacpp.json. The corpus is a fixed list of edge cases
plus seeded random strings drawn from many scripts, whitespace runs, digits, punctuation,
emoji and special-token texts; every string is stored in the file next to its ids.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_DIR = Path.home() / ".cache" / "archrun" / "models"
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

EDGE_CASES = [
    "", " ", "  ", "\n", "\t", "a", "Hello", " Hello", "Hello world", "hello  world", "x \ty",
    "trailing   ", "   leading", "a\n\nb", "a\n\n\n\nb", "a \n b", "\r\n\r\n", " \n \n ",
    "I'm you're we've they'll she'd it's DON'T I'M", "'s 't 're", "a'b", "12 345 6789 1234567",
    "3.14 -2e10 0x1F 1,000,000", "x=1; y=[1,2,3]; print(f'{x+y}')", "a—b–c…d", "«ciao» „hallo“",
    "für Straße größer", "日本語のテキスト", "中文，标点。", "한국어 텍스트", "Ελληνικά κείμενα", "עברית",
    "ไทยภาษา", "ᚠᚢᚦ runes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "😀😃😄", "👍🏽", "👨‍👩‍👧", "🇩🇪", "e\u0301", "\u00a0nbsp",
    "\u3000ideographic space", "\u2028line sep", "zero\u200bwidth", "\x04control\x07bell", "tab\x0bvt",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
    "<|im_start|>user\nhi<|im_end|>", "x<|im_end|>y<|im_end|>z", "<|im_end|><|im_end|>", "<|im_start",
    "<tool_call>{\"a\":1}</tool_call>", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<pad><unk><mask>", "[multimodal]", "<unused0>", "<reponame>x<filename>y", "<fim_prefix>a<fim_suffix>",
    "    def f(x):\n        return x\n", "\n\n\n\n\n\n\n\n\n\n\n\n", "                                  ",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "▁already▁escaped▁", "<0x41>", "\U0002a6d6 rare cjk", "\U000e0041 tag char", "\ufffd replacement",
]

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " " * 8, "\n\t\r",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "äöüßéèêçñøåÆŒ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "的一是不了人我在有他这为之大来以个中上们", "あいうえおかきくけこアイウエオ", "가나다라마바사아자차",
    "αβγδεζηθικλμνξοπρστυφχψω", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "अआइईउऊऋएऐओऔकखगघ",
    "😀🚀👍🏽❤️🎉🔥✨", "\u00a0\u2009\u3000\u200b\u200d\u0301", "—–…«»“”‘’•·",
]


def corpus() -> list[str]:
    """Edge cases + 240 seeded random strings."""
    rng = random.Random(1234)
    texts = list(EDGE_CASES)
    for _ in range(240):
        pools = rng.sample(ALPHABETS, rng.randint(1, 4))
        n = rng.randint(1, 48)
        texts.append("".join(rng.choice(rng.choice(pools)) for _ in range(n)))
    return texts


def detokenized_bytes(llama_cpp, vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    """llama_detokenize -> the raw bytes (they need not be valid UTF-8)."""
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
    if n < 0:
        raise RuntimeError(f"llama_detokenize needs {-n} bytes")
    return buf.raw[:n]


def detokenize(llama_cpp, vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> str:
    """llama_detokenize -> hex of the raw bytes."""
    return detokenized_bytes(llama_cpp, vocab, ids, remove_special, unparse_special).hex()


def vocab_facts(llama_cpp, vocab) -> dict:
    """Special ids, add flags and the end-of-generation set as llama.cpp resolves them."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def opt(tid: int) -> int | None:
        return None if tid < 0 else tid

    return {
        "n_vocab": n_vocab,
        "bos": opt(llama_cpp.llama_vocab_bos(vocab)),
        "eos": opt(llama_cpp.llama_vocab_eos(vocab)),
        "eot": opt(llama_cpp.llama_vocab_eot(vocab)),
        "pad": opt(llama_cpp.llama_vocab_pad(vocab)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "control": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)],
    }


def record(model: str) -> None:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=str(MODEL_DIR / MODELS[model]), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    entries = []
    for text in corpus():
        entry: dict = {"text": text}
        for add_special in (False, True):
            for special in (False, True):
                ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=special)
                entry[f"ids_add{int(add_special)}_special{int(special)}"] = ids
        plain = entry["ids_add1_special1"]
        entry["detok_hex"] = detokenize(llama_cpp, vocab, plain, False, False)
        entry["detok_special_hex"] = detokenize(llama_cpp, vocab, plain, False, True)
        entries.append(entry)
    out = {
        "model": model,
        "gguf": MODELS[model],
        "calls": {
            "ids_add{A}_special{S}": "Llama.tokenize(text.encode(), add_bos=A, special=S) (vocab_only)",
            "detok_hex": "llama_detokenize(ids_add1_special1, remove_special=False, unparse_special=False)",
            "detok_special_hex": "llama_detokenize(ids_add1_special1, remove_special=False, unparse_special=True)",
        },
        "versions": {"llama_cpp_python": llama_cpp.__version__},
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "vocab": vocab_facts(llama_cpp, vocab),
        "entries": entries,
    }
    path = HERE / f"{model}_llamacpp.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(entries)} strings)")


if __name__ == "__main__":
    for name in sys.argv[1:] or list(MODELS):
        record(name)
