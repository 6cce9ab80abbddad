"""archrun.io.ggufio: round trips through gguf.GGUFWriter and every hostile container (sections F1-F11 below).

Every hostile case is small by construction (a few hundred bytes), so a reader that loops,
allocates by a claimed count, or follows a bogus length shows up as a failure, not a hang.
"""

from __future__ import annotations

import contextlib
import pathlib
import resource
import struct
import time

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType, GGUFValueType
from support.gguf_fixtures import QuantTensor, RawGGUF, enc_str, random_quant_tensor, write_gguf

from archrun.errors import MissingTensor, ModelLoadError, UnsupportedQuantType
from archrun.io import ggufio, quant
from archrun.io.ggufio import GGUFFile, TensorInfo
from archrun.io.ggufset import open_gguf

T = GGMLQuantizationType
V = GGUFValueType
MODELS = pathlib.Path.home() / ".cache" / "archrun" / "models"
U64_MAX = (1 << 64) - 1


def rejects(path: pathlib.Path, match: str) -> ModelLoadError:
    """Opening ``path`` raises ModelLoadError whose message matches ``match``."""
    with pytest.raises(ModelLoadError, match=match) as info:
        open_gguf(path)
    return info.value


def one_f32_tensor(raw: RawGGUF, name: str = "w", n: int = 8) -> bytes:
    """``raw`` plus one F32 tensor of n elements at offset 0, with its data."""
    return raw.tensor(name, (n,), T.F32, 0).build(data=np.arange(n, dtype=np.float32).tobytes())


@pytest.fixture
def small_model(tmp_path: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(0)
    return write_gguf(
        tmp_path / "small.gguf",
        metadata={"llama.block_count": 2, "tokenizer.ggml.tokens": ["a", "b", "<s>"]},
        tensors={
            "token_embd.weight": rng.standard_normal((4, 64)).astype(np.float32),
            "blk.0.ffn_up.weight": random_quant_tensor(rng, T.Q4_K, (3, 256)),
            "blk.0.attn_q.weight": random_quant_tensor(rng, T.Q8_0, (2, 5, 32)),
            "norm.weight": rng.standard_normal(64).astype(np.float16),
        },
    )


# ---- round trips ------------------------------------------------------------------------------


def test_metadata_round_trip_every_value_type(tmp_path: pathlib.Path) -> None:
    md = {
        "t.u8": (200, V.UINT8), "t.i8": (-100, V.INT8), "t.u16": (60000, V.UINT16),
        "t.i16": (-30000, V.INT16), "t.u32": (4_000_000_000, V.UINT32), "t.i32": (-2_000_000_000, V.INT32),
        "t.f32": (0.1, V.FLOAT32), "t.bool": (True, V.BOOL), "t.false": (False, V.BOOL),
        "t.str": ("héllo ✓", V.STRING), "t.u64": (U64_MAX, V.UINT64), "t.i64": (-(1 << 63), V.INT64),
        "t.f64": (0.1, V.FLOAT64),
        "t.arr_i32": ([1, -2, 3], V.ARRAY, V.INT32), "t.arr_f32": ([0.5, 1.5], V.ARRAY, V.FLOAT32),
        "t.arr_u8": ([1, 255], V.ARRAY, V.UINT8), "t.arr_bool": ([True, False, True], V.ARRAY, V.BOOL),
        "t.arr_u64": ([U64_MAX, 0], V.ARRAY, V.UINT64), "t.arr_f64": ([1e300], V.ARRAY, V.FLOAT64),
        "t.arr_str": (["x", "", "ü y", "<|im_end|>"], V.ARRAY, V.STRING),
    }  # fmt: skip
    with open_gguf(write_gguf(tmp_path / "m.gguf", metadata=md)) as f:
        assert f.version == 3 and f.alignment == 32 and f.tensors == {}
        assert f.metadata["general.architecture"] == "llama"
        for key, (value, vtype, *sub) in md.items():
            assert f.value_types[key] == (vtype, *sub), key
            got = f.metadata[key]
            if vtype == V.ARRAY and sub[0] != V.STRING:
                assert isinstance(got, np.ndarray) and got.dtype.kind in "iufb", key
                np.testing.assert_array_equal(got, np.array(value, dtype=got.dtype))
            elif vtype in (V.FLOAT32,):
                assert got == np.float32(value)
            else:
                assert got == value and type(got) is type(value), key
        assert f.metadata["t.arr_i32"].dtype == np.int32
        assert f.metadata["t.arr_bool"].dtype == np.bool_
        assert f.metadata["t.arr_u64"].dtype == np.uint64


def test_empty_arrays_are_valid(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().kv_array("a.str", V.STRING, []).kv_array("a.f32", V.FLOAT32, [])
    with open_gguf(raw.write(tmp_path / "e.gguf")) as f:
        assert f.metadata["a.str"] == []
        assert f.metadata["a.f32"].shape == (0,) and f.metadata["a.f32"].dtype == np.float32


def test_version_2_is_read(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF(version=2).kv_str("general.architecture", "llama")
    with open_gguf(raw.write(tmp_path / "v2.gguf")) as f:
        assert f.version == 2 and f.metadata["general.architecture"] == "llama"


def test_tensors_round_trip(small_model: pathlib.Path) -> None:
    reader = GGUFReader(small_model)
    with open_gguf(small_model) as f:
        assert list(f.tensors) == [t.name for t in reader.tensors]  # file order
        for rt in reader.tensors:
            info = f.tensors[rt.name]
            assert info == TensorInfo(rt.name, tuple(int(x) for x in rt.shape), int(rt.tensor_type),
                                      int(rt.data_offset), int(rt.n_bytes))  # fmt: skip
            assert np.array_equal(f.raw(rt.name), np.asarray(rt.data).view(np.uint8).ravel())
        emb = f.tensors["token_embd.weight"]
        assert emb.shape == (64, 4) and emb.np_shape == (4, 64) and emb.type_name == "F32"
        q = f.tensors["blk.0.attn_q.weight"]
        assert q.shape == (32, 5, 2) and q.np_shape == (2, 5, 32) and q.type_name == "Q8_0"
        assert f.tensors["blk.0.ffn_up.weight"].nbytes == 3 * 144
        assert f.raw_rows("blk.0.attn_q.weight").shape == (10, 34)
        assert f.raw_rows("blk.0.ffn_up.weight").shape == (3, 144)
        assert f.raw_rows("norm.weight").shape == (1, 128)


def test_dequantize_matches_written_values(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    h = rng.standard_normal((2, 32)).astype(np.float16)
    q = random_quant_tensor(rng, T.Q6_K, (2, 256))
    path = write_gguf(tmp_path / "d.gguf", tensors={"x": x, "h": h, "q": q})
    with open_gguf(path) as f:
        assert np.array_equal(f.dequantize("x"), x)
        assert np.array_equal(f.dequantize("h"), h.astype(np.float32))
        got = f.dequantize("q")
        assert got.shape == (2, 256) and got.dtype == np.float32
        assert np.array_equal(got, quant.dequantize(q.data, T.Q6_K, (2, 256)))


def test_raw_is_a_read_only_view_of_the_map(small_model: pathlib.Path) -> None:
    with open_gguf(small_model) as f:
        a = f.raw("token_embd.weight")
        assert a.dtype == np.uint8 and a.ndim == 1 and not a.flags.writeable and not a.flags.owndata
        assert np.shares_memory(a, f.raw("token_embd.weight"))  # no copy: both view the same map
        with pytest.raises(ValueError):
            a[0] = 1


def test_missing_tensor(small_model: pathlib.Path) -> None:
    with open_gguf(small_model) as f:
        for fn in (f.raw, f.raw_rows, f.dequantize):
            with pytest.raises(MissingTensor, match="nope"):
                fn("nope")


def test_close_and_context_manager(small_model: pathlib.Path) -> None:
    f = open_gguf(small_model)
    view = f.raw("norm.weight")
    expected = view.copy()
    f.close()
    assert np.array_equal(view, expected)  # views handed out stay valid after close
    with pytest.raises(ValueError, match="closed"):
        f.raw("norm.weight")
    f.close()  # idempotent
    with GGUFFile(small_model) as g:
        assert g.raw("norm.weight").nbytes == 128
    assert isinstance(repr(g), str)


def test_opening_does_not_read_tensor_data(tmp_path: pathlib.Path) -> None:
    """A 4 GiB sparse tensor opens instantly and without touching its pages."""
    n = 1 << 30  # F32 elements
    path = RawGGUF().tensor("big", (n,), T.F32, 0).write(tmp_path / "big.gguf")
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size + 4 * n)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with open_gguf(path) as f:
        elapsed = time.perf_counter() - t0
        assert f.tensors["big"].nbytes == 4 * n
        assert f.raw("big")[-4:].tolist() == [0, 0, 0, 0]  # touches only the last page
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert elapsed < 2.0
    assert rss_growth_kib < 64 * 1024


def test_unsupported_tensor_type_only_fails_at_execution(tmp_path: pathlib.Path) -> None:
    q = QuantTensor(np.zeros((2, 136), np.uint8), T.IQ4_XS, (2, 256))
    with open_gguf(write_gguf(tmp_path / "iq.gguf", tensors={"w": q})) as f:
        assert f.tensors["w"].type_name == "IQ4_XS"
        assert f.raw_rows("w").shape == (2, 136)
        with pytest.raises(UnsupportedQuantType, match="IQ4_XS"):
            f.dequantize("w")


def test_custom_alignment(tmp_path: pathlib.Path) -> None:
    x = np.ones((2, 8), np.float32)
    with open_gguf(write_gguf(tmp_path / "a.gguf", tensors={"a": x, "b": x}, alignment=64)) as f:
        assert f.alignment == 64
        assert all(t.offset % 64 == 0 for t in f.tensors.values())
        assert np.array_equal(f.dequantize("b"), x)


# ---- large string arrays (vectorised shortcut and its fallbacks) -----------------------------


def _vocab(rng: np.random.Generator, n: int, extra: dict[int, bytes] | None = None) -> list[bytes]:
    pieces = ["a", "é", "▁the", "Ġworld", "日本", "🙂", "<|im_end|>", "\n", " ", "\t\r"]
    words = [("".join(rng.choice(pieces, size=rng.integers(1, 6)))).encode() for _ in range(n)]
    for i, w in (extra or {}).items():
        words[i] = w
    return words


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {0: b"", 5: b"", 6: b"", 299: b""},  # empty strings, also adjacent
        {3: b"x" * 300, 100: "é".encode() * 200, 299: b"y" * 70000},  # strings >= 256 bytes
        {7: b"a\x00b", 8: b"\x00" * 20, 9: b"\x00" * 7 + b"\x05"},  # NULs and fake length prefixes
        dict.fromkeys(range(0, 400, 2), b"z" * 257),  # mostly long strings
    ],
    ids=["plain", "empty", "long", "nul", "many-long"],
)
def test_large_string_arrays(tmp_path: pathlib.Path, extra: dict[int, bytes]) -> None:
    words = _vocab(np.random.default_rng(len(extra)), 400, extra)
    raw = RawGGUF().kv_array("tokenizer.ggml.tokens", V.STRING, words).kv_u32("general.after", 7)
    with open_gguf(raw.write(tmp_path / "v.gguf")) as f:
        assert f.metadata["tokenizer.ggml.tokens"] == [w.decode() for w in words]
        assert f.metadata["general.after"] == 7


def test_large_string_array_takes_the_shortcut(tmp_path: pathlib.Path) -> None:
    words = _vocab(np.random.default_rng(0), 1000, {10: b"", 20: b"q" * 1000})
    data = RawGGUF().kv_array("t", V.STRING, words).build(alignment=1)
    start = len(data) - sum(8 + len(w) for w in words)
    buf = bytearray(data)
    cur = ggufio._Cursor(buf, start, len(buf))
    assert ggufio._fast_string_array(cur, len(words)) == [w.decode() for w in words]
    assert cur.pos == len(data)


@pytest.mark.parametrize("bad_at", [0, 150, 399])
def test_large_string_array_errors_name_the_element(tmp_path: pathlib.Path, bad_at: int) -> None:
    words = _vocab(np.random.default_rng(bad_at), 400, {bad_at: b"ok\xff"})
    raw = RawGGUF().kv_array("tokenizer.ggml.tokens", V.STRING, words)
    rejects(raw.write(tmp_path / "u.gguf"), rf"tokenizer.ggml.tokens'\[{bad_at}\] is not valid UTF-8")
    words = _vocab(np.random.default_rng(1), 400)
    full = RawGGUF().kv_array("tokenizer.ggml.tokens", V.STRING, words).build(alignment=1)
    for cut in (len(full) - 1, len(full) - 100, len(full) // 2):
        (tmp_path / "t.gguf").write_bytes(full[:cut])
        rejects(tmp_path / "t.gguf", "truncated.*tokenizer.ggml.tokens")


# ---- F1 empty or truncated ----------------------------------------------------------------------


def test_f1_empty_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "e.gguf").write_bytes(b"")
    rejects(tmp_path / "e.gguf", "empty")


def test_f1_missing_file_and_directory(tmp_path: pathlib.Path) -> None:
    rejects(tmp_path / "absent.gguf", "cannot open")
    rejects(tmp_path, "cannot open")


def test_f1_every_truncation_of_the_header_is_rejected(small_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Cut the file at every byte of header + metadata + tensor infos, and inside the data."""
    data = small_model.read_bytes()
    with open_gguf(small_model) as f:
        header_end = f.data_offset
        last = max(f.tensors.values(), key=lambda t: t.offset)
    cut = tmp_path / "cut.gguf"
    cuts = [*range(header_end), last.offset + last.nbytes - 1, last.offset + 1]
    for n in cuts:
        cut.write_bytes(data[:n])
        with pytest.raises(ModelLoadError):
            open_gguf(cut)


def test_f1_truncated_messages_name_the_part(tmp_path: pathlib.Path) -> None:
    full = RawGGUF().kv_str("general.name", "model").build(alignment=1)
    (tmp_path / "t.gguf").write_bytes(full[: len(full) - 3])
    rejects(tmp_path / "t.gguf", "truncated.*key 'general.name'")
    data = one_f32_tensor(RawGGUF(), name="w", n=8)
    (tmp_path / "d.gguf").write_bytes(data[:-4])
    rejects(tmp_path / "d.gguf", "tensor 'w'.*past the end")


# ---- F2 bad magic or version --------------------------------------------------------------------


@pytest.mark.parametrize("magic", [b"GGML", b"ggjt", b"\x00\x00\x00\x00", b"FUGG"])
def test_f2_bad_magic(tmp_path: pathlib.Path, magic: bytes) -> None:
    rejects(RawGGUF(magic=magic).write(tmp_path / "m.gguf"), "not a GGUF file")


def test_f2_short_non_gguf_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "s.gguf").write_bytes(b"GG")
    rejects(tmp_path / "s.gguf", "truncated")
    (tmp_path / "t.txt").write_bytes(b"hello world, this is text\n")
    rejects(tmp_path / "t.txt", "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_f2_unsupported_version(tmp_path: pathlib.Path, version: int) -> None:
    rejects(RawGGUF(version=version).write(tmp_path / "v.gguf"), f"version {version}")


def test_f2_big_endian(tmp_path: pathlib.Path) -> None:
    rejects(RawGGUF(version=0x03000000).write(tmp_path / "be.gguf"), "big-endian")


# ---- F3 huge counts -----------------------------------------------------------------------------


@pytest.mark.parametrize(("n_tensors", "n_kv"), [(1 << 62, 0), (0, 1 << 62), (U64_MAX, U64_MAX), (0, 10**6)])
def test_f3_huge_counts(tmp_path: pathlib.Path, n_tensors: int, n_kv: int) -> None:
    raw = RawGGUF().kv_str("general.name", "x")
    rejects(raw.write(tmp_path / "c.gguf", n_tensors=n_tensors, n_kv=n_kv), "more than the remaining")


def test_f3_count_larger_than_present(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().kv_str("general.name", "x").kv_str("general.type", "model")
    rejects(raw.write(tmp_path / "c.gguf", n_kv=3), "truncated")


# ---- F4 string lengths --------------------------------------------------------------------------


@pytest.mark.parametrize("length", [100, 1 << 40, U64_MAX])
def test_f4_value_string_past_eof(tmp_path: pathlib.Path, length: int) -> None:
    raw = RawGGUF().kv_raw("general.name", V.STRING, enc_str("abc", length=length))
    rejects(raw.write(tmp_path / "s.gguf"), "truncated.*key 'general.name'")


def test_f4_key_length_past_eof(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF()
    raw.kvs.append(struct.pack("<Q", U64_MAX) + b"general.name")
    rejects(raw.write(tmp_path / "k.gguf"), "metadata key #0")


def test_f4_tensor_name_past_eof(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF()
    raw.infos.append(struct.pack("<Q", 1 << 33) + b"w")
    rejects(raw.write(tmp_path / "n.gguf", n_tensors=1), "tensor #0")


def test_f4_string_array_element_past_eof(tmp_path: pathlib.Path) -> None:
    body = enc_str("a") + enc_str("b", length=1 << 50)
    raw = RawGGUF().kv_raw("tokenizer.ggml.tokens", V.ARRAY, struct.pack("<IQ", V.STRING, 2) + body)
    rejects(raw.write(tmp_path / "a.gguf"), r"tokenizer.ggml.tokens'\[1\]")


# ---- F5 huge array counts -----------------------------------------------------------------------


@pytest.mark.parametrize("etype", [V.UINT8, V.FLOAT32, V.UINT64, V.STRING, V.BOOL])
@pytest.mark.parametrize("count", [1 << 40, 1 << 61, U64_MAX])
def test_f5_huge_array_count(tmp_path: pathlib.Path, etype: GGUFValueType, count: int) -> None:
    items = ["a", "b"] if etype == V.STRING else [1, 0]
    raw = RawGGUF().kv_array("tokenizer.ggml.scores", etype, items, count=count)
    rejects(raw.write(tmp_path / "a.gguf"), "truncated.*tokenizer.ggml.scores")


# ---- F6 unknown types, nested arrays ------------------------------------------------------------


@pytest.mark.parametrize("vtype", [13, 99, 0xFFFFFFFF])
def test_f6_unknown_value_type(tmp_path: pathlib.Path, vtype: int) -> None:
    raw = RawGGUF().kv_raw("general.weird", vtype, b"\x00" * 16)
    rejects(raw.write(tmp_path / "u.gguf"), f"key 'general.weird'.*unknown GGUF value type {vtype}")


def test_f6_unknown_array_element_type(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().kv_raw("general.weird", V.ARRAY, struct.pack("<IQ", 77, 1) + b"\x00" * 8)
    rejects(raw.write(tmp_path / "u.gguf"), "general.weird.*unknown GGUF value type 77")


def test_f6_nested_arrays(tmp_path: pathlib.Path) -> None:
    inner = struct.pack("<IQ", V.INT32, 1) + struct.pack("<i", 5)
    raw = RawGGUF().kv_raw("general.nested", V.ARRAY, struct.pack("<IQ", V.ARRAY, 1) + inner)
    rejects(raw.write(tmp_path / "n.gguf"), "general.nested.*nested arrays")


def test_f6_nested_arrays_from_the_writer(tmp_path: pathlib.Path) -> None:
    path = write_gguf(tmp_path / "w.gguf", metadata={"general.nested": ([[1, 2], [3]], V.ARRAY, V.ARRAY)})
    rejects(path, "nested arrays")


@pytest.mark.parametrize("code", [4, 5, 31, 99, 0xFFFFFFFF])
def test_f6_unknown_tensor_type(tmp_path: pathlib.Path, code: int) -> None:
    raw = RawGGUF().tensor("blk.0.attn_q.weight", (32,), code, 0)
    rejects(raw.write(tmp_path / "t.gguf", data=bytes(256)), f"'blk.0.attn_q.weight'.*unknown ggml type {code}")


def test_f6_bool_out_of_range(tmp_path: pathlib.Path) -> None:
    rejects(RawGGUF().kv_raw("general.flag", V.BOOL, b"\x07").write(tmp_path / "b.gguf"), "general.flag.*bool")
    raw = RawGGUF().kv_array("general.flags", V.BOOL, [0, 2])
    rejects(raw.write(tmp_path / "ba.gguf"), "general.flags.*bool")


# ---- F7 duplicates ------------------------------------------------------------------------------


def test_f7_duplicate_keys(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().kv_u32("llama.block_count", 2).kv_u32("llama.block_count", 3)
    rejects(raw.write(tmp_path / "d.gguf"), "duplicate metadata key 'llama.block_count'")


def test_f7_duplicate_tensor_names(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().tensor("w", (8,), T.F32, 0).tensor("w", (8,), T.F32, 32)
    rejects(raw.write(tmp_path / "d.gguf", data=bytes(64)), "duplicate tensor name 'w'")


def test_f7_empty_key_and_name(tmp_path: pathlib.Path) -> None:
    rejects(RawGGUF().kv_u32("", 1).write(tmp_path / "k.gguf"), "key #0 is empty")
    rejects(RawGGUF().tensor("", (8,), T.F32, 0).write(tmp_path / "n.gguf", data=bytes(32)), "empty name")


# ---- F8 alignment -------------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [0, 3, 48, 1 << 31, 0xFFFFFFFF])
def test_f8_bad_alignment(tmp_path: pathlib.Path, alignment: int) -> None:
    raw = RawGGUF().kv_u32("general.alignment", alignment)
    rejects(raw.write(tmp_path / "a.gguf", data=bytes(64)), f"general.alignment = {alignment}")


def test_f8_alignment_of_wrong_type(tmp_path: pathlib.Path) -> None:
    rejects(RawGGUF().kv_str("general.alignment", "32").write(tmp_path / "a.gguf"), "general.alignment.*integer")
    raw = RawGGUF().kv("general.alignment", V.FLOAT32, 32.0)
    rejects(raw.write(tmp_path / "f.gguf"), "general.alignment.*integer")


def test_f8_huge_alignment_u64(tmp_path: pathlib.Path) -> None:
    rejects(RawGGUF().kv("general.alignment", V.UINT64, 1 << 62).write(tmp_path / "a.gguf"), "power of two")


# ---- F9 dimensions ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_dims", [0, 5, 64, 0xFFFFFFFF])
def test_f9_bad_n_dims(tmp_path: pathlib.Path, n_dims: int) -> None:
    raw = RawGGUF().tensor("w", (8, 1, 1, 1, 1), T.F32, 0, n_dims=n_dims)
    rejects(raw.write(tmp_path / "d.gguf", data=bytes(64)), f"tensor 'w' has n_dims {n_dims}")


@pytest.mark.parametrize(
    ("ne", "match"),
    [
        ((-1,), "negative dimension"),
        ((8, -4), "negative dimension"),
        ((8, 0), "empty dimension"),
        ((1 << 32, 1 << 32), "overflows"),
        ((1 << 62, 4), "overflows"),
        ((1 << 40,), "past the end"),
    ],
)
def test_f9_bad_dimensions(tmp_path: pathlib.Path, ne: tuple[int, ...], match: str) -> None:
    rejects(RawGGUF().tensor("w", ne, T.F32, 0).write(tmp_path / "d.gguf", data=bytes(64)), match)


@pytest.mark.parametrize(("ggml_type", "ne0"), [(T.Q4_0, 33), (T.Q4_K, 128), (T.Q8_0, 16), (T.Q6_K, 896)])
def test_f9_row_not_multiple_of_block(tmp_path: pathlib.Path, ggml_type: T, ne0: int) -> None:
    raw = RawGGUF().tensor("w", (ne0, 2), ggml_type, 0)
    rejects(raw.write(tmp_path / "r.gguf", data=bytes(4096)), f"tensor 'w'.*not a multiple.*{ggml_type.name}")


# ---- F10 offsets --------------------------------------------------------------------------------


def test_f10_misaligned_offset(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().tensor("w", (8,), T.F32, 4)
    rejects(raw.write(tmp_path / "o.gguf", data=bytes(64)), "tensor 'w': offset 4 is not a multiple")


def test_f10_overlapping_tensors(tmp_path: pathlib.Path) -> None:
    raw = RawGGUF().tensor("a", (16,), T.F32, 0).tensor("b", (8,), T.F32, 32)
    rejects(raw.write(tmp_path / "o.gguf", data=bytes(128)), "tensors 'a' and 'b' overlap")
    raw = RawGGUF().tensor("a", (8,), T.F32, 0).tensor("b", (8,), T.F32, 0)
    rejects(raw.write(tmp_path / "s.gguf", data=bytes(128)), "overlap")


@pytest.mark.parametrize("offset", [64, 1 << 40, U64_MAX - 31, (1 << 64) - (1 << 20)])
def test_f10_offset_past_eof_or_wrapping(tmp_path: pathlib.Path, offset: int) -> None:
    raw = RawGGUF().tensor("w", (8,), T.F32, offset)
    rejects(raw.write(tmp_path / "o.gguf", data=bytes(64)), "tensor 'w'")


# ---- F11 invalid UTF-8 --------------------------------------------------------------------------


BAD_UTF8 = [b"\xff", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf"]  # stray, truncated, surrogate, overlong


@pytest.mark.parametrize("bad", BAD_UTF8)
def test_f11_non_utf8_strings(tmp_path: pathlib.Path, bad: bytes) -> None:
    rejects(RawGGUF().kv_str(b"general." + bad, "x").write(tmp_path / "k.gguf"), "UTF-8")
    rejects(RawGGUF().kv_str("general.name", bad).write(tmp_path / "v.gguf"), "general.name.*UTF-8")
    raw = RawGGUF().kv_array("tokenizer.ggml.tokens", V.STRING, [b"ok", b"fine", bad])
    rejects(raw.write(tmp_path / "a.gguf"), r"tokenizer.ggml.tokens'\[2\] is not valid UTF-8")
    raw = RawGGUF().tensor(b"w" + bad, (8,), T.F32, 0)
    rejects(raw.write(tmp_path / "t.gguf", data=bytes(32)), "tensor #0.*UTF-8")


# ---- fuzz: random corruption never escapes as another exception -----------------------------


def test_random_byte_corruption_is_typed_or_valid(small_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    data = bytearray(small_model.read_bytes())
    with open_gguf(small_model) as f:
        header_end = f.data_offset
    rng = np.random.default_rng(1234)
    bad = tmp_path / "fuzz.gguf"
    for _ in range(300):
        mutated = bytearray(data)
        for pos in rng.integers(0, header_end, size=rng.integers(1, 4)):
            mutated[pos] = rng.integers(0, 256)
        bad.write_bytes(bytes(mutated))
        with contextlib.suppress(ModelLoadError):
            open_gguf(bad).close()


# ---- real models --------------------------------------------------------------------------------

REAL_MODELS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
]


def real_model(model: str) -> pathlib.Path:
    path = MODELS / model
    if not path.exists():
        pytest.skip(f"{model} not fetched")
    return path


@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_model_structure(model: str) -> None:
    """Converters pack tensors back to back (each padded to the alignment) after the header."""
    with open_gguf(real_model(model)) as f:
        assert f.version == 3 and f.metadata["general.architecture"] in ("llama", "gemma3", "qwen2")
        expected = f.data_offset
        for t in f.tensors.values():
            assert t.offset == expected, t.name
            expected = -(-(t.offset + t.nbytes) // f.alignment) * f.alignment
        assert f.path.stat().st_size >= expected - f.alignment
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert isinstance(tokens, list) and all(isinstance(t, str) for t in tokens[:100])
        assert len(tokens) == len(f.metadata["tokenizer.ggml.token_type"])
        assert f.value_types["tokenizer.ggml.tokens"] == (V.ARRAY, V.STRING)


@pytest.mark.parametrize(
    "model",
    [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        pytest.param("gemma-3-270m-q4_k_m.gguf", marks=pytest.mark.slow),
        pytest.param("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", marks=pytest.mark.slow),
    ],
)
def test_real_model_agrees_with_gguf_reader(model: str) -> None:
    """Every metadata value and tensor info equals what gguf-py's GGUFReader reads (slow: it is)."""
    path = real_model(model)
    reader = GGUFReader(path)
    with open_gguf(path) as f:
        assert [t.name for t in reader.tensors] == list(f.tensors)
        for rt in reader.tensors:
            info = f.tensors[rt.name]
            assert (info.offset, info.nbytes, info.ggml_type) == (rt.data_offset, rt.n_bytes, rt.tensor_type)
            assert info.shape == tuple(int(x) for x in rt.shape)
        assert set(f.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}
        for key in f.metadata:
            want, got = reader.fields[key].contents(), f.metadata[key]
            if isinstance(got, np.ndarray):
                np.testing.assert_array_equal(got, np.asarray(want))
            else:
                assert got == pytest.approx(want) if isinstance(want, float) else got == want, key


def _mapped_rss_kib(path: pathlib.Path) -> int:
    """Resident KiB of this process's mappings of `path` (from /proc/self/smaps)."""
    total, inside = 0, False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split()[0]:
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not pathlib.Path("/proc/self/smaps").exists(), reason="needs /proc/self/smaps")
def test_release_view_drops_resident_pages_and_keeps_the_data(tmp_path: pathlib.Path) -> None:
    data = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    path = write_gguf(tmp_path / "big.gguf", tensors={"w": data, "v": data[:8]})
    with open_gguf(path) as f:
        rows = f.raw_rows("w")
        assert np.array_equal(rows.view(np.float32), data)  # every page resident now
        assert _mapped_rss_kib(path) >= 4096
        ggufio.release_view(rows[: rows.shape[0] // 2])
        assert _mapped_rss_kib(path) <= 2048 + 8
        assert np.array_equal(rows.view(np.float32), data)  # re-read on demand
        ggufio.release_view(np.zeros(8, np.uint8))  # not a view of a mapping: ignored
    ggufio.release_view(rows)  # closed file: ignored
    assert np.array_equal(rows.view(np.float32), data)
