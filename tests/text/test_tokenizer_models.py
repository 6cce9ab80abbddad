"""Tokenizer model types beyond gpt2/llama: the `default` pre-tokenizer fallback, gemma4 (SPM-style
BPE), bert (WPM). Small hand-made vocabularies; parity with llama.cpp on real vocabularies is in
tests/text/test_tokenizer_llamacpp_vocabs.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support.tokenizers import BPE_TOKENS, BYTE_CHARS, bpe_meta

from archrun.errors import ArchrunWarning, TokenizerError
from archrun.text.tokenizer import Tokenizer

# --- missing tokenizer.ggml.pre: llama.cpp's 'default' regexes, with a warning ---


def test_missing_pre_warns_and_uses_default():
    with pytest.warns(ArchrunWarning, match="tokenizer.ggml.pre is missing"):
        tok = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": None}))
    assert tok.pre == "default"
    explicit = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": "default"}))
    text = "Hello, world!! 12345 it's <=> x"
    assert tok.encode(text, add_special=False) == explicit.encode(text, add_special=False)
    # the default regexes isolate punctuation runs and 3-digit groups: "12345" -> "123" "45"
    ids = tok.encode("12345", add_special=False)
    assert tok.decode(ids) == "12345" and len(ids) == 5  # no merges for digits in this vocabulary


def test_bpe_byte_the_vocabulary_lacks_blocks_merges():
    """A byte with no token is dropped after merging, so its neighbours do not merge across it
    (llama.cpp keeps it as a symbol until the end; falcon's vocabulary lacks 28 bytes)."""
    tokens = [t for t in BPE_TOKENS if t != BYTE_CHARS[0x0B]] + ["ĉĉ"]
    tok = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.tokens": tokens,
                                              "tokenizer.ggml.merges": ["ĉ ĉ"]}))
    assert [tok.token_text(i) for i in tok.encode("\t\x0b\t", add_special=False)] == ["ĉ", "ĉ"]
    assert [tok.token_text(i) for i in tok.encode("\t\t", add_special=False)] == ["ĉĉ"]


# --- gemma4: BPE over raw UTF-8 with ▁ for spaces and <0xNN> byte fallback ---


def gemma4_meta(**override) -> dict:
    """A tiny gemma4 vocabulary: control tokens, 256 byte tokens, ▁-words, newline runs."""
    words = ["▁", "a", "b", "▁a", "ab", "▁ab", "\n", "\n\n", "\n\n\n"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    types = [3, 3, 3, 3] + [6] * 256 + [1] * len(words)
    meta = {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.merges": ["▁ a", "a b", "▁a b", "\n \n"],  # no merge builds "\n\n\n"
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": False,
    }
    meta.update(override)
    return {k: v for k, v in meta.items() if v is not None}


def test_gemma4_spaces_bytes_and_newline_runs():
    tok = Tokenizer.from_metadata(gemma4_meta())
    texts = lambda ids: [tok.token_text(i) for i in ids]  # noqa: E731
    assert texts(tok.encode("ab ab", add_special=False)) == ["ab", "▁ab"]
    assert texts(tok.encode("a€", add_special=False)) == ["a", "<0xE2>", "<0x82>", "<0xAC>"]
    # a newline run that is itself a token is taken whole, even when no merge could build it
    assert texts(tok.encode("a\n\n\nb", add_special=False)) == ["a", "\n\n\n", "b"]
    assert tok.decode(tok.encode("ab ab\n\n\na€", add_special=False)) == "ab ab\n\n\na€"
    # llama.cpp adds BOS for gemma4 even when the file says add_bos_token = false
    assert tok.add_bos and tok.encode("a")[0] == 2


def test_gemma4_reads_no_default_ids():
    tok = Tokenizer.from_metadata(gemma4_meta(**{"tokenizer.ggml.eos_token_id": None}))
    assert tok.eos_id is None  # a gpt2 vocabulary would default to id 11
    with pytest.raises(TokenizerError, match="no bos id"):  # BOS forced on, but there is none
        Tokenizer.from_metadata(gemma4_meta(**{"tokenizer.ggml.bos_token_id": None}))


@pytest.mark.parametrize("override, message", [
    ({"tokenizer.ggml.merges": None}, "merges is missing"),
    ({"tokenizer.ggml.merges": ["a c"]}, "is not a token"),
    ({"tokenizer.ggml.merges": ["ab"]}, "not of the form"),
])
def test_gemma4_bad_metadata(override, message):
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(gemma4_meta(**override))


# --- bert: WordPiece ---


def wpm_meta(**override) -> dict:
    """A tiny BERT vocabulary in llama.cpp's form: word starts carry ▁, continuations do not."""
    words = ["▁hello", "▁world", "▁un", "aff", "able", "▁!", "▁,", "▁你", "▁好", "▁cafe", "s"]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    meta = {
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3] * 5 + [1] * len(words), dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.seperator_token_id": 3,
        "tokenizer.ggml.unknown_token_id": 1,
        "tokenizer.ggml.padding_token_id": 0,
    }
    meta.update(override)
    return {k: v for k, v in meta.items() if v is not None}


def test_wpm_words_and_pieces():
    tok = Tokenizer.from_metadata(wpm_meta())
    texts = lambda ids: [tok.token_text(i) for i in ids]  # noqa: E731
    assert texts(tok.encode("Hello, WORLD!", add_special=False)) == ["▁hello", "▁,", "▁world", "▁!"]
    assert texts(tok.encode("unaffable", add_special=False)) == ["▁un", "aff", "able"]
    assert texts(tok.encode("Cafés", add_special=False)) == ["▁cafe", "s"]  # accents stripped
    assert texts(tok.encode("你好", add_special=False)) == ["▁你", "▁好"]  # CJK: one word each
    assert texts(tok.encode("hello xyz\u200b", add_special=False)) == ["▁hello", "[UNK]"]
    assert texts(tok.encode("hello")) == ["[CLS]", "▁hello", "[SEP]"]
    assert tok.decode(tok.encode("hello world", add_special=False)) == " hello world"


def test_wpm_normalizer_keys():
    tok = Tokenizer.from_metadata(wpm_meta(**{"tokenizer.ggml.normalizer.lowercase": False}))
    assert tok.encode("Hello", add_special=False) == [tok.unk_id]
    with pytest.raises(TokenizerError, match="must be bool"):
        Tokenizer.from_metadata(wpm_meta(**{"tokenizer.ggml.normalizer.lowercase": 1}))


@pytest.mark.parametrize("override, message", [
    ({"tokenizer.ggml.seperator_token_id": 99}, "outside the vocabulary"),
    ({"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.token_type": None,
      "tokenizer.ggml.bos_token_id": None, "tokenizer.ggml.seperator_token_id": None,
      "tokenizer.ggml.unknown_token_id": None, "tokenizer.ggml.padding_token_id": None}, "bos id"),
])
def test_wpm_bad_metadata(override, message):
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(wpm_meta(**override))


def test_wpm_without_unknown_token():
    meta = wpm_meta(**{"tokenizer.ggml.tokens": ["▁a", "[CLS]", "[SEP]"], "tokenizer.ggml.token_type": None,
                       "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.seperator_token_id": 2,
                       "tokenizer.ggml.unknown_token_id": None, "tokenizer.ggml.padding_token_id": None})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = Tokenizer.from_metadata(meta)
    assert tok.encode("a", add_special=False) == [0]
    with pytest.raises(TokenizerError, match="unknown token"):
        tok.encode("b")


# --- t5: unigram (UGM) with a precompiled charsmap ---


def charsmap(mapping: dict[bytes, bytes]) -> np.ndarray:
    """A precompiled charsmap (XCDA + NUL-terminated replacements) mapping one-byte keys: the root's
    BASE is 256, so key byte c is the node 256 ^ c (LCHECK c, LEAF, BASE 1024), whose value entry
    at (256 ^ c) ^ 1024 holds the offset of the replacement string."""
    replacements = b""
    offsets = {}
    for key, value in mapping.items():
        offsets[key] = len(replacements)
        replacements += value + b"\0"
    size = 4096
    array = [0] * size
    array[0] = 256 << 10
    for key in mapping:
        (c,) = key
        child = 256 ^ c
        array[child] = (1024 << 10) | (1 << 8) | c  # BASE 1024, leaf, LCHECK c
        array[child ^ 1024] = offsets[key]  # value: index of the replacement string
    blob = np.array(array, dtype="<u4").tobytes()
    return np.frombuffer(len(blob).to_bytes(4, "little") + blob + replacements, dtype=np.uint8)


def ugm_meta(**override) -> dict:
    pieces = {"▁": -2.0, "a": -3.0, "b": -3.0, "▁a": -1.0, "ab": -1.5, "▁ab": -4.0, "<u>": -9.0}
    tokens = ["<pad>", "</s>", "<unk>", *pieces]
    meta = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3, 3, 2, 1, 1, 1, 1, 1, 1, 4], dtype=np.int32),
        "tokenizer.ggml.scores": np.array([0, 0, 0, *pieces.values()], dtype=np.float32),
        "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.remove_extra_whitespaces": True,
        "tokenizer.ggml.precompiled_charsmap": charsmap({b"A": b"a", b"\t": b" "}),
    }
    meta.update(override)
    return {k: v for k, v in meta.items() if v is not None}


def test_ugm_viterbi_and_normalization():
    tok = Tokenizer.from_metadata(ugm_meta())
    texts = lambda ids: [tok.token_text(i) for i in ids]  # noqa: E731
    # best summed score: "▁"+"ab" (-3.5) beats "▁a"+"b" (-4), "▁ab" (-4) and "▁"+"a"+"b" (-8)
    assert texts(tok.encode("ab", add_special=False)) == ["▁", "ab"]
    assert texts(tok.encode("A", add_special=False)) == ["▁a"]  # the charsmap maps A -> a
    assert texts(tok.encode("a \t  a", add_special=False)) == ["▁a", "▁a"]  # spaces merged, tab mapped
    assert texts(tok.encode("axyb", add_special=False)) == ["▁a", "<unk>", "b"]  # unknown run -> one
    assert texts(tok.encode("<u>a", add_special=False)) == ["<u>", "▁a"]  # user-defined: cut out first
    assert tok.encode("a") == [tok.encode("a", add_special=False)[0], 1]  # t5 adds EOS, no BOS
    assert tok.decode(tok.encode("ab a", add_special=False)) == "ab a"


def test_ugm_without_charsmap_or_scores():
    tok = Tokenizer.from_metadata(ugm_meta(**{"tokenizer.ggml.precompiled_charsmap": None,
                                              "tokenizer.ggml.scores": None}))
    assert tok.decode(tok.encode("ab", add_special=False)) == "ab"


@pytest.mark.parametrize("blob, message", [
    (np.zeros(2, np.uint8), "too small"),
    (np.frombuffer((1000).to_bytes(4, "little") + b"\0" * 8, np.uint8), "does not fit"),
    (np.frombuffer((4).to_bytes(4, "little") + (7 << 10).to_bytes(4, "little") + b"x\0", np.uint8), "XCDA"),
    (np.array([1.0, 2.0]), "int8/uint8"),
    ("abc", "byte array"),
])
def test_ugm_bad_charsmap(blob, message):
    with pytest.raises(TokenizerError, match=message):
        tok = Tokenizer.from_metadata(ugm_meta(**{"tokenizer.ggml.precompiled_charsmap": blob}))
        tok.encode("abc")


def test_ugm_long_user_defined_tokens_stay_cheap():
    """Prefix search over user-defined tokens is a sorted-list bisection: 300 tokens of 4000 bytes
    (all prefixes of which would take ~1.8 GB) build and encode at once."""
    longs = [f"{i:03d}" + "x" * 3997 for i in range(300)]
    meta = ugm_meta()
    tokens = [*meta["tokenizer.ggml.tokens"], *longs]
    meta.update({"tokenizer.ggml.tokens": tokens,
                 "tokenizer.ggml.token_type": np.array([*meta["tokenizer.ggml.token_type"], *[4] * 300], np.int32),
                 "tokenizer.ggml.scores": np.zeros(len(tokens), np.float32)})
    tok = Tokenizer.from_metadata(meta)
    text = "007" + "x" * 5000  # starts like a user-defined token but is longer than every one
    ids = tok.encode(text, add_special=False)
    assert tok.token_text(ids[0]) == "007" + "x" * 3997  # cut out whole by the special-token partition


def test_afmoe_digit_groups_join_the_text_before_a_run():
    """llama.cpp's afmoe/tiny_aya splitter: groups of three from the right, the text before a run
    joined to its first group (unlike the regex tokenizer.json states)."""
    from archrun_blocks.pretokenizers import digit_group_spans

    def pieces(text):
        return [text[a:b] for a, b in digit_group_spans(text)]

    assert pieces("1234567") == ["1", "234", "567"]
    assert pieces("ab1234x") == ["ab1", "234", "x"]
    assert pieces("a  123") == ["a  123"]
    assert pieces("½²3 xyz") == ["½²3", " xyz"]  # any Unicode number
    tok = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": "afmoe"}))
    assert tok.decode(tok.encode("x 1234567 y", add_special=False)) == "x 1234567 y"


def test_kimi_k2_splitter():
    """llama.cpp's hand-written Kimi-K2 splitter: Han runs, non-Han words with a leading symbol
    and a contraction, numbers by three, symbol runs, whitespace."""
    from archrun_blocks.pretokenizers import kimi_k2_spans

    def pieces(text):
        return [text[a:b] for a, b in kimi_k2_spans(text)]

    assert pieces("你好world's 12345!!\n\n  x") == ["你好", "world's", " ", "123", "45", "!!\n\n", " ", " x"]
    assert pieces("(abc漢") == ["(abc", "漢"]
