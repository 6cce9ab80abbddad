"""Parity with llama.cpp's own tokenizer tests (tests/test-tokenizer-0.cpp).

llama.cpp ships vocabulary-only GGUF files (``models/ggml-vocab-*.gguf``) with ``.inp`` (test
strings separated by ``\\n__ggml_vocab_test__\\n``) and ``.out`` (one line of expected ids per
string, recorded from the HF tokenizer of each model). archrun must produce those ids exactly,
tokenizing with ``add_special=False, parse_special=False`` as test-tokenizer-0 does.

The files come with llama.cpp's source, which ``make test`` fetches (``python -m
archrun.conformance.llamacpp``) into ``~/.cache/archrun/llama.cpp/<version>/models``.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest

from archrun.conformance.llamacpp import source_dir
from archrun.errors import ArchrunWarning
from archrun.text.tokenizer import Tokenizer

SEPARATOR = "\n__ggml_vocab_test__\n"
MODELS = source_dir() / "models"
RECORDED = Path(__file__).parent.parent / "goldens" / "tokenizer" / "llamacpp_vocabs.json"


def _vocab_files() -> list[Path]:
    """Every ggml-vocab-*.gguf that has both an .inp and an .out next to it."""
    if not MODELS.is_dir():
        return []
    return sorted(p for p in MODELS.glob("ggml-vocab-*.gguf")
                  if p.with_name(p.name + ".inp").is_file() and p.with_name(p.name + ".out").is_file())


def read_cases(vocab: Path) -> list[tuple[str, list[int]]]:
    """(input text, expected ids) pairs, parsed the way test-tokenizer-0.cpp's read_tests does."""
    raw = vocab.with_name(vocab.name + ".inp").read_bytes().decode("utf-8")
    expected = vocab.with_name(vocab.name + ".out").read_text(encoding="utf-8").split("\n")
    if expected and expected[-1] == "":
        expected.pop()
    inputs: list[str] = []
    pos = 0
    while pos < len(raw):
        cut = raw.find(SEPARATOR, pos)
        if cut < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:cut])
        pos = cut + len(SEPARATOR)
    assert len(inputs) == len(expected), f"{vocab.name}: {len(inputs)} inputs, {len(expected)} outputs"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs, expected, strict=True)]


_TOKENIZERS: dict[Path, Tokenizer] = {}


def _tokenizer(vocab: Path) -> Tokenizer:
    if vocab not in _TOKENIZERS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ArchrunWarning)  # e.g. the default pre-tokenizer warning
            _TOKENIZERS[vocab] = Tokenizer.from_gguf(vocab)
    return _TOKENIZERS[vocab]


VOCABS = _vocab_files()

# vocabularies archrun cannot tokenize yet -> reason (strict xfail: a fix must remove the entry)
KNOWN_GAPS: dict[str, str] = {}


def _name(vocab: Path) -> str:
    return vocab.name.removeprefix("ggml-vocab-").removesuffix(".gguf")


def _param(vocab: Path):
    gap = KNOWN_GAPS.get(_name(vocab))
    marks = [pytest.mark.xfail(reason=gap, strict=True)] if gap else []
    return pytest.param(vocab, id=_name(vocab), marks=marks)


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"llama.cpp's source is not fetched ({MODELS} is absent; "
                                                 "`python -m archrun.conformance.llamacpp` fetches it)")
def test_vocab_files_present():
    """The fetched source holds the test vocabularies (guards against a silently empty matrix)."""
    assert len(VOCABS) >= 10, [p.name for p in VOCABS]


@pytest.mark.parametrize("vocab", [_param(v) for v in VOCABS])
def test_llamacpp_vocab_parity(vocab: Path):
    """Every test string of the vocabulary tokenizes to llama.cpp's expected ids."""
    tok = _tokenizer(vocab)
    failures = []
    cases = read_cases(vocab)
    for text, want in cases:
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            failures.append(f"{text[:60]!r}: got {got[:24]} want {want[:24]}")
    assert not failures, f"{len(failures)}/{len(cases)} cases differ:\n" + "\n".join(failures[:10])


if not VOCABS:  # pragma: no cover - only without the fetched source
    def test_llamacpp_vocab_parity_skipped():
        pytest.skip(f"llama.cpp's source is not fetched ({MODELS} holds no ggml-vocab files; "
                    "`python -m archrun.conformance.llamacpp` fetches it)")


# --- the vocabularies without .inp/.out, and the newest kinds, vs llama.cpp's recorded output ---


def _recorded() -> dict:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


def _detok(value: str | dict) -> bytes:
    return bytes.fromhex(value["hex"]) if isinstance(value, dict) else value.encode("utf-8")


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"llama.cpp's source is not fetched ({MODELS} is absent)")
@pytest.mark.parametrize("name", sorted(_recorded()["vocabs"]) if RECORDED.is_file() else [])
def test_llamacpp_vocab_recorded(name: str):
    """ids with (add_special, parse_special) off/off, on/off, off/on and both detokenizations equal
    llama.cpp's, recorded by goldens/tokenizer/record_llamacpp_vocabs.py on every .inp string plus
    record_llamacpp.py's corpus (edge cases, seeded random multi-script strings)."""
    golden = _recorded()
    vocab = MODELS / f"ggml-vocab-{name}.gguf"
    want = golden["vocabs"][name]
    if hashlib.sha256(vocab.read_bytes()).hexdigest() != want["sha256"]:
        pytest.skip(f"{vocab.name} differs from the recorded file")
    tok = _tokenizer(vocab)
    failures = []
    for i, text in enumerate(golden["texts"]):
        for key, add, special in (("plain", False, False), ("add_special", True, False),
                                  ("parse_special", False, True)):
            got = tok.encode(text, add_special=add, parse_special=special)
            if got != want[key][i]:
                failures.append(f"{key} {text[:50]!r}: got {got[:20]} want {want[key][i][:20]}")
        ids = want["add_special"][i]
        for key, skip in (("detok", False), ("detok_skip", True)):
            got = tok.decode_bytes(ids, skip_special=skip)
            if got != _detok(want[key][i]):
                failures.append(f"{key} {text[:50]!r}: got {got[:60]!r} want {_detok(want[key][i])[:60]!r}")
    assert not failures, f"{len(failures)} differ:\n" + "\n".join(failures[:10])


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"llama.cpp's source is not fetched ({MODELS} is absent)")
@pytest.mark.parametrize("name", sorted(_recorded()["stress"]) if RECORDED.is_file() else [])
def test_llamacpp_vocab_stress(name: str):
    """All 19 files on seeded random strings heavy in control characters, non-ASCII whitespace,
    combining marks and special-token texts: ids equal llama.cpp's (recorded)."""
    golden = _recorded()
    vocab = MODELS / f"ggml-vocab-{name}.gguf"
    want = golden["stress"][name]
    if hashlib.sha256(vocab.read_bytes()).hexdigest() != want["sha256"]:
        pytest.skip(f"{vocab.name} differs from the recorded file")
    tok = _tokenizer(vocab)
    failures = [f"{text[:50]!r}: got {got[:20]} want {ids[:20]}"
                for text, ids in zip(golden["stress_texts"], want["plain"], strict=True)
                if (got := tok.encode(text, add_special=False)) != ids]
    assert not failures, f"{len(failures)} differ:\n" + "\n".join(failures[:10])


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"llama.cpp's source is not fetched ({MODELS} is absent)")
@pytest.mark.parametrize("pre", sorted(_recorded()["pre_variants"]) if RECORDED.is_file() else [])
def test_llamacpp_pre_tokenizer_variants(pre: str):
    """Pre-tokenizers no test vocabulary uses: a test vocabulary with `tokenizer.ggml.pre` (and the
    model, gpt2) replaced tokenizes the first 40 stress strings as llama.cpp did on such a copy."""
    from archrun.io.ggufset import open_gguf

    golden = _recorded()
    want = golden["pre_variants"][pre]
    vocab = MODELS / f"ggml-vocab-{want['base']}.gguf"
    if hashlib.sha256(vocab.read_bytes()).hexdigest() != want["sha256"]:
        pytest.skip(f"{vocab.name} differs from the recorded file")
    gguf = open_gguf(vocab)
    try:
        tok = Tokenizer.from_metadata({**gguf.metadata, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre})
    finally:
        gguf.close()
    texts = golden["stress_texts"][:len(want["plain"])]
    failures = [f"{text[:50]!r}: got {got[:20]} want {ids[:20]}" for text, ids in zip(texts, want["plain"], strict=True)
                if (got := tok.encode(text, add_special=False)) != ids]
    assert not failures, f"{len(failures)} differ:\n" + "\n".join(failures[:10])
