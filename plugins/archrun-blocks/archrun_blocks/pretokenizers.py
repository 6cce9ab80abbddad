"""The pre-tokenizers of byte-level BPE vocabularies, by `tokenizer.ggml.pre` value.

The regexes are llama.cpp's (src/llama-vocab.cpp, llm_tokenizer_bpe), verbatim; where llama.cpp
runs a hand-written splitter instead of a regex (unicode.cpp: afmoe's digit groups, Kimi-K2's
words), the table holds a Python port of it: a function `spans(text) -> [(start, end), ...]`.
Registered through `archrun_register_pre_tokenizers` (archrun_blocks.plugin).
"""

from __future__ import annotations

import re
import unicodedata

from archrun.text.tokenizer import WHITESPACE, PreTokenizer, Splitter

# --- splitters llama.cpp runs instead of a regex (unicode.cpp) ---


def digit_group_spans(text: str) -> list[tuple[int, int]]:
    """llama.cpp's unicode_regex_split_custom_afmoe: each run of numbers (Unicode N) is cut into
    groups of three from the right, whatever precedes the run (since the last cut) stays joined to
    its first group, and the text after the last run is one piece."""
    spans: list[tuple[int, int]] = []
    prev = pos = 0
    n = len(text)
    while pos < n:
        if not unicodedata.category(text[pos]).startswith("N"):
            pos += 1
            continue
        start = pos
        while pos < n and unicodedata.category(text[pos]).startswith("N"):
            pos += 1
        first = start + ((pos - start) % 3 or 3)
        for cut in range(first, pos + 1, 3):
            spans.append((prev, cut))
            prev = cut
    if prev < n:
        spans.append((prev, n))
    return spans


_HAN_RANGES = (  # llama.cpp's unicode_cpt_is_han
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def kimi_k2_spans(text: str) -> list[tuple[int, int]]:  # noqa: C901 - a port, kept in the C++ order
    """llama.cpp's unicode_regex_split_custom_kimi_k2 (its stand-in for Kimi-K2's regex): Han runs,
    non-Han letter words with an optional leading symbol and contraction, numbers by three,
    symbol runs, then whitespace as in the GPT-4o-style regexes."""
    n = len(text)
    cats = [unicodedata.category(c)[0] for c in text]
    han = [any(a <= ord(c) <= b for a, b in _HAN_RANGES) for c in text]

    def letter(i: int) -> bool:
        return i < n and cats[i] == "L"

    def word(i: int) -> bool:  # a letter that is not Han
        return letter(i) and not han[i]

    def number(i: int) -> bool:
        return i < n and cats[i] == "N"

    def space(i: int) -> bool:
        return i < n and text[i] in WHITESPACE

    spans: list[tuple[int, int]] = []
    prev = pos = 0

    def cut(end: int) -> None:
        nonlocal prev
        if end > prev:
            spans.append((prev, end))
        prev = end

    while pos < n:
        c = text[pos]
        if han[pos]:
            while pos < n and han[pos]:
                pos += 1
            cut(pos)
            continue
        lead = not (c in "\r\n" or letter(pos) or number(pos))
        if word(pos) or (lead and word(pos + 1)):
            start = pos
            pos += lead
            while word(pos):
                pos += 1
            if pos > start + lead:
                if text[pos:pos + 1] == "'" and pos + 1 < n:
                    nxt = text[pos + 1].lower()
                    if nxt in "stmd":
                        pos += 2
                    elif pos + 2 < n and nxt + text[pos + 2].lower() in ("re", "ve", "ll"):
                        pos += 3
                cut(pos)
                continue
            pos = start
        if number(pos):
            ini = pos
            while number(pos):
                pos += 1
                if pos - ini >= 3:
                    cut(pos)
                    ini = pos
            cut(pos)
            continue
        q = pos + 1 if c == " " else pos
        if q < n and not (space(q) or letter(q) or number(q)):
            pos = q
            while pos < n and not (space(pos) or letter(pos) or number(pos)):
                pos += 1
            while pos < n and text[pos] in "\r\n":
                pos += 1
            cut(pos)
            continue
        k, last_nl = 0, 0
        while space(pos + k):
            if text[pos + k] in "\r\n":
                last_nl = pos + k + 1
            k += 1
        if last_nl:
            pos = last_nl
        elif k > 1 and pos + k < n:
            pos += k - 1
        elif k:
            pos += k
        else:
            pos += 1
        cut(pos)
    return spans


# --- regexes ---

_GPT2_RE = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_RE = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2_RE = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
# llama.cpp matches regexes without \p{..} through std::wregex on text whose non-ASCII whitespace
# was replaced by \x0b, so those characters never fall in a literal range: the ranges below that
# cover some (U+0800-U+4E00, U+3000) exclude them explicitly (Oniguruma's && class intersection)
_WIDE_SPACES = "\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CJK = f"[一-龥ࠀ-一가-\ud7ff&&[^{_WIDE_SPACES}]]+"
_LETTER_CASE = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+@C"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*@C"
)
# letters of deepseek-llm's second regex; escaped because editors NFC-normalize e.g. U+1F7D
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_CASED_WORDS = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" + _CONTRACTIONS + "?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" + _CONTRACTIONS + "?"
)


def _collapse_letters(regex: str) -> str:
    """llama.cpp reads \\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm}, \\p{Lo} as "a letter" (unicode.cpp's collapsed
    categories), while Oniguruma would honour them: rewrite them to \\p{L}."""
    return re.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", regex)


_PORO_RE = " ?[^(\\s|.,!?…。，、।۔،)]+"

_REGEXES: dict[str, tuple[str | Splitter, ...]] = {
    "default": (
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        _GPT2_RE,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ),
    "llama3": (_LLAMA3_RE,),
    "deepseek-llm": (
        "[\r\n]",
        _DEEPSEEK_LETTERS,
        f"\\s?[!-/:-~！-／：-～‘-‟\u3000-。&&[^{_WIDE_SPACES}]]+",
        "\\s+$",
        _CJK,
        "\\p{N}+",
    ),
    "deepseek-v3": (
        "\\p{N}{1,3}",
        "[一-龥\u3040-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "deepseek-coder": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"),
    "falcon": ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2_RE, "[0-9][0-9][0-9]"),
    "starcoder": ("\\p{N}", _GPT2_RE),
    "gpt-2": (_GPT2_RE,),
    "qwen2": (_QWEN2_RE,),
    "qwen35": (
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "poro": (_PORO_RE,),
    "viking": (_PORO_RE, "\\p{N}"),
    "tekken": (
        _LETTER_CASE.replace("@C", "")
        + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "gpt-4o": (
        _LETTER_CASE.replace("@C", _CONTRACTIONS + "?")
        + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "bailingmoe": (
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ),
    "seed-coder": (
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "gemma4": ("[^\\n]+|[\\n]+",),  # SPM-style BPE: lines and newline runs, merged whole
    "minicpm5": (
        "\\p{N}{1,3}",
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "exaone-moe": (
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ),
    "ufakzeka": ("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "laguna": ("[^\\n]+|[\\n]+", _QWEN2_RE),
    "spark2_5": (
        "\\p{N}{1,3}",
        "[一-龥\u3040-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
        "\\p{N}",
    ),
    "hy_v4": (
        "\\p{N}{1,3}",
        "[一-龥\u3040-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "jais-2": (
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
        "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)"
        "|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    ),
    "granite-embed-multi-97m": (
        _LETTER_CASE.replace("\\p{L}])", "\\p{L}\\p{M}])").replace("@C", _CONTRACTIONS + "?")
        + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "youtu": (
        "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u3040-ゟ゠-ヿ]+",
        _collapse_letters(_CASED_WORDS + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    ),
    "tiny_aya": (
        digit_group_spans,  # llama.cpp: \d{1,3}(?=(?:\d{3})*\b), run by afmoe's splitter
        _collapse_letters(_CASED_WORDS + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    ),
    "afmoe": (
        digit_group_spans,  # llama.cpp: \p{AFMoE_digits}, its splitter's trigger
        "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
        "\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
        "\u1100-\u11ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    # a zero-width split before each group of three digits counted from the right; llama.cpp's \d
    # (std::wregex, POSIX digit class) is [0-9], Oniguruma's would take any decimal digit
    "superbpe": ("\\p{N}+", "(?=([0-9]{3})+(?![0-9]))"),
    "chameleon": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]",
        _GPT2_RE,
    ),
}


def pre_tokenizer_table() -> dict[str, PreTokenizer]:
    """`tokenizer.ggml.pre` value -> PreTokenizer, grouped as in llama.cpp's load() (llama_vocab::impl)."""
    r = _REGEXES
    groups: list[tuple[tuple[str, ...], PreTokenizer]] = [
        (("default",), PreTokenizer(r["default"])),
        (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
         PreTokenizer(r["llama3"], ignore_merges=True, add_bos=True)),
        (("dbrx", "smaug-bpe"), PreTokenizer(r["llama3"])),
        (("deepseek-llm",), PreTokenizer(r["deepseek-llm"], clean_spaces=False)),
        (("deepseek-coder",), PreTokenizer(r["deepseek-coder"], clean_spaces=False)),
        (("deepseek-v3", "hunyuan-dense"), PreTokenizer(r["deepseek-v3"], clean_spaces=False)),
        (("falcon",), PreTokenizer(r["falcon"])),
        (("starcoder", "refact", "codeshell", "exaone", "minerva-7b"), PreTokenizer(r["starcoder"])),
        (("command-r", "smollm"), PreTokenizer(r["starcoder"], clean_spaces=False)),
        (("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "gigachat", "mellum", "a.x-4.0"),
         PreTokenizer(r["gpt-2"])),
        (("trillion", "granite-docling"), PreTokenizer(r["gpt-2"], clean_spaces=False)),
        (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"),
         PreTokenizer(r["qwen2"], clean_spaces=False)),
        (("stablelm2", "megrez"), PreTokenizer(r["qwen2"])),
        (("qwen35",), PreTokenizer(r["qwen35"], clean_spaces=False)),
        (("poro-chat",), PreTokenizer(r["poro"], clean_spaces=False)),
        (("bloom", "gpt3-finnish"), PreTokenizer(r["poro"])),
        (("viking",), PreTokenizer(r["viking"], clean_spaces=False)),
        (("chatglm-bpe",), PreTokenizer(r["llama3"], bos_default=None)),
        (("glm4", "glm5"), PreTokenizer(r["llama3"], ignore_merges=True, bos_default=None)),
        (("tekken",), PreTokenizer(r["tekken"], clean_spaces=False, ignore_merges=True, add_bos=True)),
        (("gpt-4o", "llama4", "kanana2", "minimax-m2"), PreTokenizer(r["gpt-4o"], clean_spaces=False)),
        (("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizer(r["bailingmoe"], clean_spaces=False)),
        (("seed-coder",), PreTokenizer(r["seed-coder"], clean_spaces=False)),
        (("gemma4", "granite-embed-multi-311m"),
         PreTokenizer(r["gemma4"], add_bos=True, spm_style=True, force_bos=True)),
        (("sarvam-moe",), PreTokenizer(r["gemma4"], clean_spaces=False, spm_style=True)),
        (("jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "modern-bert", "jina-v1-en", "jina-v2-code",
          "roberta-bpe"), PreTokenizer(r["gpt-2"])),  # (the last three set add_sep: rerank prompts only)
        (("jina-v5-nano",), PreTokenizer(r["llama3"], ignore_merges=True, add_bos=True)),
        (("talkie",), PreTokenizer(r["gpt-4o"], clean_spaces=False)),
        (("mellum2",), PreTokenizer(r["starcoder"])),
        (("minicpm5",), PreTokenizer(r["minicpm5"], ignore_merges=True)),
        (("exaone-moe",), PreTokenizer(r["exaone-moe"])),
        (("jais-2",), PreTokenizer(r["jais-2"])),
        (("ufakzeka",), PreTokenizer(r["ufakzeka"], clean_spaces=False)),
        (("laguna",), PreTokenizer(r["laguna"], clean_spaces=False)),
        (("spark2_5",), PreTokenizer(r["spark2_5"], clean_spaces=False)),
        (("hy_v4", "joyai-llm"), PreTokenizer(r["hy_v4"], clean_spaces=False)),
        (("granite-embed-multi-97m",), PreTokenizer(r["granite-embed-multi-97m"], clean_spaces=False,
                                                    ignore_merges=True)),
        (("youtu",), PreTokenizer(r["youtu"], clean_spaces=False, ignore_merges=True)),
        (("chameleon",), PreTokenizer(r["chameleon"], clean_spaces=False, add_bos=True)),
        (("tiny_aya", "cohere2moe"), PreTokenizer(r["tiny_aya"], clean_spaces=False)),
        (("afmoe",), PreTokenizer(r["afmoe"], clean_spaces=False)),
        (("superbpe",), PreTokenizer(r["superbpe"], clean_spaces=False)),
        (("kimi-k2",), PreTokenizer((kimi_k2_spans,), clean_spaces=False)),
    ]
    return {name: pre for names, pre in groups for name in names}

