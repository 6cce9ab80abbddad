"""Tokenizer tests: llama.cpp goldens on the real models, round trips, streaming, T1-T3 bad inputs."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from support.tokenizers import BPE_TOKENS, BYTE_CHARS, MODELS, bpe_meta, real_tokenizer

from archrun.errors import TokenizerError
from archrun.text.tokenizer import Tokenizer, pre_tokenizers

GOLDENS = pathlib.Path(__file__).parent.parent / "goldens"


# --- real models ---




def load_golden(path: pathlib.Path) -> dict:
    if not path.exists():
        pytest.skip(f"golden {path.relative_to(GOLDENS)} not recorded")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("model", MODELS)
def test_llamacpp_ids_own_corpus(model):
    """Every string x (add_special, parse_special) of the recorded corpus gives llama.cpp's ids."""
    golden = load_golden(GOLDENS / "tokenizer" / f"{model}_llamacpp.json")
    tok = real_tokenizer(model)
    bad = []
    for entry in golden["entries"]:
        for add in (False, True):
            for special in (False, True):
                want = entry[f"ids_add{int(add)}_special{int(special)}"]
                got = tok.encode(entry["text"], add_special=add, parse_special=special)
                if got != want:
                    bad.append((entry["text"], add, special, got, want))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"


@pytest.mark.parametrize("model", MODELS)
def test_llamacpp_ids_shared_corpus(model):
    """The project-wide tokenization goldens (tests/goldens/real/<model>_tokenize.json)."""
    golden = load_golden(GOLDENS / "real" / f"{model}_tokenize.json")
    tok = real_tokenizer(model)
    calls = {"bos": (True, False), "plain": (False, False), "special": (False, True)}
    for case in golden["cases"]:
        for name, (add, special) in calls.items():
            ids = tok.encode(case["text"], add_special=add, parse_special=special)
            assert ids == case[name], (case["text"], name)
            for suffix, skip in (("_detok", True), ("_detok_special", False)):
                want = case[name + suffix]
                want = want["text"].encode() if want["text"] is not None else bytes.fromhex(want["hex"])
                assert tok.decode_bytes(ids, skip_special=skip) == want, (case["text"], name + suffix)


@pytest.mark.parametrize("model", MODELS)
def test_llamacpp_detokenize(model):
    """decode_bytes equals llama_detokenize, with and without rendering control tokens."""
    golden = load_golden(GOLDENS / "tokenizer" / f"{model}_llamacpp.json")
    tok = real_tokenizer(model)
    for entry in golden["entries"]:
        ids = entry["ids_add1_special1"]
        assert tok.decode_bytes(ids, skip_special=True).hex() == entry["detok_hex"], entry["text"]
        assert tok.decode_bytes(ids).hex() == entry["detok_special_hex"], entry["text"]


@pytest.mark.parametrize("model", MODELS)
def test_llamacpp_special_ids_and_eog(model):
    """bos/eos/eot/pad, add_bos/add_eos and the end-of-generation set match llama.cpp."""
    facts = load_golden(GOLDENS / "tokenizer" / f"{model}_llamacpp.json")["vocab"]
    tok = real_tokenizer(model)
    assert tok.n_vocab == facts["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (facts["bos"], facts["eos"], facts["pad"])
    assert tok.eot_id in facts["eog"]
    assert (tok.add_bos, tok.add_eos) == (facts["add_bos"], facts["add_eos"])
    assert tok.eog_ids == frozenset(facts["eog"])
    assert [t for t in range(tok.n_vocab) if tok.is_control(t)] == facts["control"]


ROUND_TRIP = [
    "Hello, world!", "  two leading spaces", "trailing\t\t", "line\r\nbreaks\n\n\n", "def f(x):\n    return x",
    "Straße größer naïve café", "日本語 中文 한국어", "مرحبا", "😀 👍🏽 👨‍👩‍👧 🇩🇪", "e\u0301 zero\u200bwidth",
    "<|im_end|> and <end_of_turn> typed as text", "\U0002a6d6 rare", "12345678901234567890",
]


@pytest.mark.parametrize("model", MODELS)
def test_round_trip(model):
    """decode(encode(x)) == x: every vocabulary here is lossless for text without C0 control bytes."""
    tok = real_tokenizer(model)
    for text in ROUND_TRIP:
        assert tok.decode(tok.encode(text, add_special=False)) == text
        assert tok.decode(tok.encode(text), skip_special=True) == text


@pytest.mark.parametrize("model", MODELS)
def test_incremental_decoder_never_splits_characters(model):
    """Streaming ids one at a time yields only whole characters and the same text as decode."""
    tok = real_tokenizer(model)
    text = "Emoji 😀🚀👍🏽 rare \U0002a6d6\U0002a6d7 and € sign"
    ids = tok.encode(text, add_special=False)
    dec = tok.incremental()
    chunks = [dec.push(t) for t in ids] + [dec.flush()]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)


def _byte_token_ids(tok: Tokenizer, data: bytes) -> list[int]:
    """Ids of the single-byte tokens spelling `data` (byte-level alphabet or <0xNN>)."""
    from archrun.text.tokenizer.bpe import _BYTE_CHARS

    texts = [f"<0x{b:02X}>" if tok.model == "llama" else _BYTE_CHARS[b] for b in data]
    index = {tok.token_text(i): i for i in range(tok.n_vocab)}
    return [index[t] for t in texts]


@pytest.mark.parametrize("model", ["qwen25", "gemma3"])
def test_incremental_decoder_holds_partial_utf8(model):
    """An emoji pushed byte token by byte token appears only once its last byte arrives."""
    tok = real_tokenizer(model)
    ids = _byte_token_ids(tok, "a😀".encode())
    dec = tok.incremental()
    assert [dec.push(t) for t in ids] == ["a", "", "", "", "😀"]
    dec.push(ids[1])
    assert dec.flush() == "\ufffd"  # a dangling lead byte at the end of the stream


def test_special_text_is_plain_unless_parse_special():
    tok = real_tokenizer("qwen25")
    im_end = tok.eos_id
    assert tok.token_text(im_end) == "<|im_end|>"
    assert im_end not in tok.encode("a<|im_end|>b")
    assert tok.encode("a<|im_end|>b", parse_special=True).count(im_end) == 1
    assert tok.decode(tok.encode("a<|im_end|>b", parse_special=True), skip_special=True) == "ab"


def test_user_defined_tokens_always_split():
    """Gemma's user-defined newline-run tokens are cut out even with parse_special=False (llama.cpp)."""
    tok = real_tokenizer("gemma3")
    ids = tok.encode("a\n\n\nb", add_special=False)
    assert tok.token_text(ids[1]) == "\n\n\n"


def test_eog_ids_of_real_models():
    qwen = real_tokenizer("qwen25")
    assert {qwen.eos_id, qwen.bos_id} <= qwen.eog_ids  # <|im_end|>, <|endoftext|>
    gemma = real_tokenizer("gemma3")
    assert {gemma.token_text(t) for t in gemma.eog_ids} >= {"<eos>", "<end_of_turn>"}


def test_from_gguf_reads_chat_template():
    assert "<|im_start|>" in real_tokenizer("smollm2").chat_template
    assert real_tokenizer("gemma3").chat_template is None


# --- synthetic vocabularies: small, exact, hand-checkable ---







def spm_meta(**override) -> dict:
    """A SentencePiece vocabulary with scores and byte fallback."""
    pieces = {"▁": -1.0, "a": -2.0, "b": -2.0, "c": -2.0, "▁a": -1.5, "ab": -0.5, "bc": -0.4, "▁ab": -0.3}
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + list(pieces.values())
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
    }
    meta.update(override)
    return meta


def test_bpe_merges_by_rank():
    tok = Tokenizer.from_metadata(bpe_meta())
    ids = tok.encode("the the", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["t", "he", "Ġthe"]  # "Ġ t" outranks "h e"
    assert tok.decode(ids) == "the the"
    assert tok.add_bos is False and tok.bos_id == 259


def test_bpe_special_partition():
    tok = Tokenizer.from_metadata(bpe_meta())
    assert tok.encode("<|im_start|>x", add_special=False, parse_special=True) == [259, BYTE_CHARS.index("x")]
    assert 259 not in tok.encode("<|im_start|>x", add_special=False)
    assert tok.encode("a<tool>b", add_special=False) == [BYTE_CHARS.index("a"), 261, BYTE_CHARS.index("b")]


def test_plain_spans_protect_control_tokens():
    tok = Tokenizer.from_metadata(bpe_meta())
    text = "<|im_start|>x<|im_start|>"
    ids = tok.encode(text, add_special=False, parse_special=True, plain_spans=[(12, 25)])
    assert ids[0] == 259 and ids.count(259) == 1


def test_spm_merges_by_score_with_byte_fallback():
    tok = Tokenizer.from_metadata(spm_meta())
    # "▁abc": bigrams ▁a(-1.5) ab(-0.5) bc(-0.4) -> bc first, then ▁a; "▁a"+"bc" is no token
    ids = tok.encode("abc", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["▁a", "bc"]
    assert tok.encode("abc")[0] == 1  # add_bos defaults to true for SPM
    ids = tok.encode("ab€", add_special=False)  # € is not in the vocabulary: three byte tokens
    assert [tok.token_text(i) for i in ids] == ["▁ab", "<0xE2>", "<0x82>", "<0xAC>"]
    assert tok.decode(ids) == "ab€"  # the space prefix added by encode is removed again


def test_spm_space_prefix_key():
    tok = Tokenizer.from_metadata(spm_meta(**{"tokenizer.ggml.add_space_prefix": False}))
    assert [tok.token_text(i) for i in tok.encode("ab", add_special=False)] == ["ab"]


def test_clean_spaces_like_llama_cpp():
    """pre 'default' cleans " ?", " '" contractions and " ' " on decode (llama_detokenize passes)."""
    tok = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": "default"}))
    text = "a ? b ' c 's d 't e 're"
    assert tok.decode(tok.encode(text, add_special=False)) == "a? b'c's d 't e're"


@pytest.mark.parametrize("pre", sorted(p for p, pre in pre_tokenizers().items() if not pre.spm_style))
def test_every_pre_tokenizer_compiles(pre):
    """Byte-level pre-tokenizers (SPM-style ones: tests/text/test_tokenizer_models.py)."""
    tok = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": pre}))
    text = "Hello world 123 你好 it's\n\n  x"
    assert tok.decode(tok.encode(text, add_special=False)) == text


# --- T1-T3: malformed metadata raises TokenizerError naming the problem ---

BAD_METADATA = {
    "no model": ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
    "unknown model": ({"tokenizer.ggml.model": "mystery"}, "unsupported tokenizer model"),
    "model not str": ({"tokenizer.ggml.model": 3}, "tokenizer.ggml.model must be str"),
    "unknown pre": ({"tokenizer.ggml.pre": "mystery"}, "unknown pre-tokenizer"),
    "tokens not list": ({"tokenizer.ggml.tokens": "abc"}, "array of strings"),
    "token not str": ({"tokenizer.ggml.tokens": [*BPE_TOKENS, 7]}, "tokenizer.ggml.tokens\\[262\\]"),
    "tokens empty": ({"tokenizer.ggml.tokens": []}, "missing or empty"),
    "duplicate token": ({"tokenizer.ggml.tokens": [*BPE_TOKENS, "a"]}, "duplicates"),
    "token too long": ({"tokenizer.ggml.tokens": [*BPE_TOKENS, "x" * 5000]}, "bytes long"),
    "types float": ({"tokenizer.ggml.token_type": np.ones(262, np.float32)}, "integer array"),
    "types short": ({"tokenizer.ggml.token_type": np.ones(10, np.int32)}, "has 10 entries"),
    "types value": ({"tokenizer.ggml.token_type": np.full(262, 9, np.int32)}, "not a token type"),
    "types strings": ({"tokenizer.ggml.token_type": ["1"] * 262}, "integer array"),
    "merge no space": ({"tokenizer.ggml.merges": ["Ġt"]}, "not of the form"),
    "merge unknown": ({"tokenizer.ggml.merges": ["q z"]}, "is not a token"),
    "merges not str": ({"tokenizer.ggml.merges": [1, 2]}, "tokenizer.ggml.merges\\[0\\]"),
    "no merges": ({"tokenizer.ggml.merges": None}, "merges is missing"),
    "bos out of range": ({"tokenizer.ggml.bos_token_id": 262}, "outside the vocabulary"),
    "eos negative": ({"tokenizer.ggml.eos_token_id": -1}, "outside the vocabulary"),
    "bos bool": ({"tokenizer.ggml.bos_token_id": True}, "must be int"),
    "bos float": ({"tokenizer.ggml.bos_token_id": 1.0}, "must be int"),
    "add_bos int": ({"tokenizer.ggml.add_bos_token": 1}, "must be bool"),
    "add_bos no id": ({"tokenizer.ggml.pre": "glm4", "tokenizer.ggml.add_bos_token": True,
                       "tokenizer.ggml.bos_token_id": None}, "no bos id"),
    "template int": ({"tokenizer.chat_template": 5}, "chat_template must be str"),
    "surrogate token": ({"tokenizer.ggml.tokens": [*BPE_TOKENS, "\ud800"]}, "not valid Unicode"),
}


@pytest.mark.parametrize("case", BAD_METADATA)
def test_bad_bpe_metadata(case):
    override, message = BAD_METADATA[case]
    meta = bpe_meta(**override)
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(meta)


BAD_SPM = {
    "no scores": ({"tokenizer.ggml.scores": None}, "scores is missing"),
    "scores short": ({"tokenizer.ggml.scores": np.zeros(3, np.float32)}, "has 3 entries"),
    "scores nan": ({"tokenizer.ggml.scores": np.full(267, np.nan, np.float32)}, "NaN"),
    "scores strings": ({"tokenizer.ggml.scores": ["x"] * 267}, "numeric array"),
    "bad byte token": ({"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "<0xZZ>",
                                                  *(f"<0x{b:02X}>" for b in range(1, 256)),
                                                  "▁", "a", "b", "c", "▁a", "ab", "bc", "▁ab"]}, "<0xNN>"),
    "unk out of range": ({"tokenizer.ggml.unknown_token_id": 10**6}, "outside the vocabulary"),
}


@pytest.mark.parametrize("case", BAD_SPM)
def test_bad_spm_metadata(case):
    override, message = BAD_SPM[case]
    meta = {k: v for k, v in spm_meta(**override).items() if v is not None}
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(meta)


def test_missing_byte_token_is_an_error_at_encode():
    meta = spm_meta()
    meta["tokenizer.ggml.tokens"] = [t if t != "<0xE2>" else "<0xE2>x" for t in meta["tokenizer.ggml.tokens"]]
    meta["tokenizer.ggml.token_type"] = np.where(np.array(meta["tokenizer.ggml.tokens"]) == "<0xE2>x", 1,
                                                 meta["tokenizer.ggml.token_type"]).astype(np.int32)
    tok = Tokenizer.from_metadata(meta)
    with pytest.raises(TokenizerError, match="0xE2"):
        tok.encode("€")


@pytest.mark.parametrize("ids", [[262], [-1], [1.0], [True], ["3"], [None]])
def test_decode_rejects_bad_ids(ids):
    tok = Tokenizer.from_metadata(bpe_meta())
    with pytest.raises(TokenizerError):
        tok.decode(ids)
    with pytest.raises(TokenizerError):
        tok.incremental().push(ids[0])


def test_encode_rejects_non_text():
    tok = Tokenizer.from_metadata(bpe_meta())
    with pytest.raises(TokenizerError, match="expects str"):
        tok.encode(b"bytes")
    with pytest.raises(TokenizerError, match="lone surrogate"):
        tok.encode("a\ud800b")


def test_numpy_ids_are_accepted():
    tok = Tokenizer.from_metadata(bpe_meta())
    ids = np.array(tok.encode("the"), dtype=np.int32)
    assert tok.decode(ids) == "the"
