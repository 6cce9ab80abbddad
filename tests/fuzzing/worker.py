"""The fuzz worker: runs cases one by one and reports how each ended.

Protocol: one JSON case per line on stdin, one JSON outcome per line on the result fd. The
worker's own stdout/stderr (fd 1/2) go to /dev/null so nothing a case prints can corrupt the
protocol. Before the first case it warms the kernels (no case pays a compile) and then limits
its address space (RLIMIT_AS) to what it uses plus `--memory` MiB: an input that makes archrun
allocate beyond that ends in MemoryError, which is a finding.

`run_case(case)` is also what `--replay` calls in-process, so a saved case reproduces exactly.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import math
import os
import resource
import shutil
import stat
import struct
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (fuzzing package, gguf_fixtures)

import archrun  # noqa: E402
from archrun.errors import ArchrunError  # noqa: E402
from fuzzing import cases as C  # noqa: E402
from fuzzing.gguf_model import KV, GGUFModel, Tensor, parse, serialize  # noqa: E402

_SEED_BYTES: dict[int, bytes] = {}
_MODELS: dict[tuple[int, str], Any] = {}
_SEED_DIR: list[Path] = []


class Outcome(Exception):
    """Internal: a step's result."""


# ---- seeds and edits ------------------------------------------------------------------------------

def seed_bytes(i: int) -> bytes:
    if i not in _SEED_BYTES:
        _SEED_BYTES[i] = (C.ROOT / C.SEEDS[i % len(C.SEEDS)]).read_bytes()
    return _SEED_BYTES[i]


def _index(ref: str) -> int | None:
    """'#12' -> 12 (the i-th key or tensor of the file), anything else -> None."""
    digits = ref[1:]
    return int(digits) if ref.startswith("#") and digits.isascii() and digits.isdigit() else None


def _key(m: GGUFModel, ref: str) -> str:
    i = _index(ref)
    if i is not None:
        return m.kvs[i % len(m.kvs)].key if m.kvs else "general.architecture"
    return ref.replace("{arch}", m.arch)


def _tensor(m: GGUFModel, ref: str) -> Tensor | None:
    if not m.tensors:
        return None
    i = _index(ref)
    return m.tensors[i % len(m.tensors)] if i is not None else m.tensor(ref)


def _float(v: Any) -> float:
    return float(v)  # JSON holds "nan", "inf", "-inf" as strings


def _kv_value(vtype: int, value: Any, etype: int | None = None, items: Any = None) -> Any:
    if vtype in (6, 12):
        return _float(value)
    if vtype == 9:
        if etype in (6, 12):
            return [_float(x) for x in items]
        return list(items)
    return value


_DATA = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "denormal": 1e-40, "huge": 1e38, "zero": 0.0,
         "-zero": -0.0, "max": np.finfo(np.float32).max}
_SCALES = {"nan": np.nan, "inf": np.inf, "denormal": 3e-8, "zero": 0.0, "huge": 60000.0}


def _quantize(t: Tensor, qtype: int, scales: str, seed: int) -> None:
    """Replace t's data with random blocks of `qtype` (scales finite or hostile)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from support.gguf_fixtures import SCALE_FIELDS, random_blocks

    block, _size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    n = math.prod(t.dims) if t.dims else 0
    n_blocks = max(1, min(n // block, 1 << 16))
    rng = np.random.default_rng(seed)
    blocks = random_blocks(rng, qtype, n_blocks, finite=True)
    if scales != "finite":
        bad = np.array([_SCALES[scales]], np.float16).view(np.uint8)
        fields = SCALE_FIELDS.get(qtype, ())
        rows = rng.integers(0, n_blocks, size=max(1, n_blocks // 8))
        if qtype in (0, 1, 30):  # float tensors: poison elements
            dt = {0: np.float32, 1: np.float16, 30: np.float16}[qtype]
            flat = blocks.reshape(-1).view(dt)
            flat[rng.integers(0, len(flat), size=4)] = _SCALES[scales]
        for lo, hi in fields:
            blocks[rows, lo:hi] = bad
    t.ggml_type, t.data = qtype, blocks.tobytes()


def apply_edit(m: GGUFModel, e: dict) -> None:
    """One structured edit (see cases.gguf_edits)."""
    op = e["op"]
    if op == "set_kv":
        key = _key(m, e["key"])
        kv = KV(key, e["vtype"], _kv_value(e["vtype"], e.get("value"), e.get("etype"), e.get("items")),
                e.get("etype"), e.get("count"))
        if e["vtype"] in C.BAD_TYPE_CODES:
            kv.value = b""
        old = m.get(key)
        if old is not None:
            m.kvs[m.kvs.index(old)] = kv
        else:
            m.kvs.append(kv)
    elif op == "del_kv":
        m.kvs = [kv for kv in m.kvs if kv.key != _key(m, e["key"])]
    elif op == "dup_kv":
        kv = m.get(_key(m, e["key"]))
        if kv is not None:
            m.kvs.append(KV(kv.key, kv.vtype, kv.value, kv.etype, kv.count))
    elif op == "retype_kv":
        kv = m.get(_key(m, e["key"]))
        if kv is not None:
            from fuzzing.gguf_model import _value
            kv.value = _value(kv.vtype, kv.value, kv.etype, kv.count)
            kv.vtype = e["vtype"]
    elif op == "array_count":
        kv = m.get(_key(m, e["key"]))
        if kv is not None and kv.vtype == 9:
            kv.count = e["count"]
    elif op in ("array_set", "array_append"):
        _edit_array(m, e)
    elif op == "merge_pair":  # a merge of two tokens whose concatenation may be no token
        tokens = m.get("tokenizer.ggml.tokens")
        merges = m.get("tokenizer.ggml.merges")
        if tokens is not None and merges is not None and tokens.value and not isinstance(merges.value, bytes):
            t = list(tokens.value)
            merges.value = [*merges.value, f"{t[e['a'] % len(t)]} {t[e['b'] % len(t)]}"]
    elif op == "spm":
        _make_spm(m, e["scores"])
    elif op == "special_id":
        role = {"padding": "padding", "unknown": "unknown"}.get(e["role"], e["role"])
        key = f"tokenizer.ggml.{role}_token_id"
        kv = KV(key, 4, e["value"]) if 0 <= e["value"] < 2**32 else KV(key, 5, e["value"])
        m.kvs = [k for k in m.kvs if k.key != key] + [kv]
    elif op == "header":
        _edit_header(m, e["field"], e["value"])
    else:
        _edit_tensor(m, e)


def _edit_array(m: GGUFModel, e: dict) -> None:
    kv = m.get(e["key"])
    if kv is None or kv.vtype != 9 or isinstance(kv.value, bytes):
        return
    items = list(kv.value)
    if e["op"] == "array_append":
        items += [e["value"]] * e["n"]
    elif items:
        items[e["index"] % len(items)] = e["value"]
    if kv.etype != 8:
        items = [x if isinstance(x, (int, float, np.integer, np.floating)) else 0 for x in items]
    kv.value = items


def _make_spm(m: GGUFModel, scores: str) -> None:
    """Turn the seed's vocabulary into a 'llama' (SentencePiece) one, with scores as asked."""
    tokens = m.get("tokenizer.ggml.tokens")
    n = len(tokens.value) if tokens is not None and not isinstance(tokens.value, bytes) else 0
    m.kvs = [kv for kv in m.kvs if kv.key not in ("tokenizer.ggml.model", "tokenizer.ggml.scores")]
    m.kvs.append(KV("tokenizer.ggml.model", 8, "llama"))
    if scores == "missing":
        return
    vals = [-float(i) for i in range(n if scores != "short" else max(0, n - 1))]
    if vals and scores in ("nan", "inf"):
        vals[len(vals) // 2] = float(scores)
    m.kvs.append(KV("tokenizer.ggml.scores", 9, vals, 6))


def _edit_header(m: GGUFModel, field: str, value: int) -> None:
    if field == "magic":
        m.magic = struct.pack("<Q", value % 2**64)[:4]
    elif field == "alignment":
        m.alignment = value if 0 < value <= 4096 else m.alignment
        m.kvs = [kv for kv in m.kvs if kv.key != "general.alignment"] + [KV("general.alignment", 4, value)]
    else:
        setattr(m, field, value)


def _edit_tensor(m: GGUFModel, e: dict) -> None:
    t = _tensor(m, e["tensor"])
    if t is None:
        return
    op = e["op"]
    if op == "tensor_dims":
        t.dims = e["dims"]
    elif op == "tensor_ndims":
        t.n_dims = e["n_dims"]
    elif op == "tensor_type":
        t.ggml_type = e["type"]
    elif op == "tensor_offset":
        t.offset = e["offset"]
    elif op == "tensor_rename":
        other = _tensor(m, e["name"]) if _index(e["name"]) is not None else None
        t.name = other.name if other is not None else e["name"]
    elif op == "tensor_drop":
        m.tensors.remove(t)
    elif op == "tensor_dup":
        m.tensors.append(Tensor(t.name, list(t.dims), t.ggml_type, t.data))
    elif op == "tensor_values":
        dt = {0: np.float32, 1: np.float16, 30: np.float16}.get(t.ggml_type)
        if dt is None or not t.data:
            return
        arr = np.frombuffer(t.data, dtype=dt).copy()
        start = e["pos"] % len(arr)
        arr[start:start + e["n"]] = _DATA[e["value"]]
        t.data = arr.tobytes()
    elif op == "tensor_quantize":
        _quantize(t, e["type"], e["scales"], e["seed"])


def apply_bytes(data: bytes, e: dict) -> bytes:
    """One byte-level edit of the serialized file."""
    if not data:
        return data
    op, n = e["op"], len(data)
    if op == "truncate":
        return data[:e["pos"] % n]
    if op in ("flip", "flip_header"):
        pos = e["pos"] % n
        return data[:pos] + bytes([data[pos] ^ e["xor"]]) + data[pos + 1:]
    if op == "set":
        pos, b = e["pos"] % n, bytes.fromhex(e["hex"])
        return data[:pos] + b + data[pos + len(b):]
    if op == "insert":
        pos = e["pos"] % n
        return data[:pos] + bytes.fromhex(e["hex"]) + data[pos:]
    if op == "delete":
        pos = e["pos"] % n
        return data[:pos] + data[pos + e["n"]:]
    raise ValueError(op)


def build_file(case: dict, directory: Path) -> Path:
    """The mutated GGUF of a case, written to `directory`."""
    m = parse(seed_bytes(case["seed"]))
    if m.get("tokenizer.chat_template") is None:  # so that chat() renders (edits may replace it)
        m.kvs.append(KV("tokenizer.chat_template", 8, C.CHATML))
    for e in case.get("edits", ()):
        apply_edit(m, e)
    data = serialize(m)
    for e in case.get("bytes", ()):
        data = apply_bytes(data, e)
    path = directory / "case.gguf"
    path.write_bytes(data)
    return path


# ---- hostile values -------------------------------------------------------------------------------

class _StrSub(str):
    pass


class _IntSub(int):
    pass


class _Raising:
    def __index__(self):
        raise RuntimeError("index")

    def __len__(self):
        raise RuntimeError("len")

    def __iter__(self):
        raise RuntimeError("iter")

    def __float__(self):
        raise RuntimeError("float")


def build_value(v: Any) -> Any:
    """Tagged JSON (cases.values) -> the hostile Python value."""
    if isinstance(v, list):
        return [build_value(x) for x in v]
    if not isinstance(v, dict):
        return v
    tag = v.get("$")
    if tag is None:
        return {k: build_value(x) for k, x in v.items()}
    return _BUILDERS[tag](v)


def _int_or_str(k: str) -> int | str:
    try:
        return int(k)
    except ValueError:
        return k


def _deep(v: dict) -> Any:
    out: Any = "x"
    for _ in range(v["depth"]):
        out = [out] if v["kind"] == "list" else {"content": out}
    return out


def _selfref(v: dict) -> Any:
    if v["kind"] == "list":
        x: Any = []
        x.append(x)
        return x
    d: dict = {"role": "user"}
    d["content"] = d
    return d


def _ndarray(v: dict) -> np.ndarray:
    shape, dt = tuple(v["shape"]), v["dtype"]
    fill = v["fill"]
    if fill == "arange":
        return np.arange(math.prod(shape)).reshape(shape).astype(dt)
    if fill == "nan":
        return np.full(shape, np.nan, dtype="float64").astype(dt) if dt != "object" else np.full(shape, None)
    if fill == "big":
        return np.full(shape, 2**62, dtype="int64").astype(dt) if dt != "object" else np.full(shape, 2**70)
    return (np.zeros if fill == "zeros" else np.ones)(shape, dtype=dt)


_BUILDERS = {
    "float": lambda v: _float(v["v"]),
    "bytes": lambda v: bytes.fromhex(v["hex"]),
    "np": lambda v: np.array(v["v"]).astype(v["dtype"])[()],
    "ndarray": _ndarray,
    "object": lambda v: object(),
    "lambda": lambda v: (lambda *a, **k: 0),
    "complex": lambda v: complex(1, 2),
    "set": lambda v: {1, 2},
    "gen": lambda v: (i for i in range(3)),
    "selfref": _selfref,
    "deep": _deep,
    "floatkeys": lambda v: {1.5: 1.0, 2.0: -1.0},
    "intkeys": lambda v: {_int_or_str(k): build_value(x) for k, x in v["d"].items()},
    "rep": lambda v: v["s"] * v["n"],
    "range": lambda v: list(range(v["n"])),
    "surrogate": lambda v: "a\udcffb",
    "strsub": lambda v: _StrSub("user"),
    "intsub": lambda v: _IntSub(3),
    "raising": lambda v: _Raising(),
}


# ---- scenarios ------------------------------------------------------------------------------------

class Steps:
    """Runs the steps of a case; a typed error ends a step, anything else is recorded."""

    def __init__(self) -> None:
        self.results: list[dict] = []

    def run(self, name: str, fn, *args, **kwargs) -> Any:
        try:
            value = fn(*args, **kwargs)
        except ArchrunError as exc:
            # a typed error that wraps an exhausted address space still allocated too much: a finding
            status = "untyped" if "MemoryError" in str(exc) or not str(exc).strip() else "typed"
            self.results.append({"step": name, "status": status, "type": type(exc).__name__,
                                 "message": str(exc)[:300], "where": _where(exc)})
            return _FAILED
        except SystemExit as exc:
            self.results.append({"step": name, "status": "ok", "exit": str(exc.code)})
            return _FAILED
        except BaseException as exc:  # noqa: BLE001 - the point: PanicException, RecursionError, MemoryError
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.results.append({"step": name, "status": "untyped", "type": type(exc).__name__,
                                 "message": str(exc)[:300], "where": _where(exc)})
            return _FAILED
        self.results.append({"step": name, "status": "ok"})
        return value


_FAILED = object()


def _where(exc: BaseException) -> str:
    """The innermost archrun frame of a traceback (root-cause grouping), else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "archrun" in f.filename and "fuzzing" not in f.filename]
    f = (ours or frames or [None])[-1]
    return f"{Path(f.filename).name}:{f.lineno}:{f.name}" if f is not None else "?"


def _drive(gen: Any, limit: int = 64) -> Any:
    for i, _ in enumerate(gen):
        if i > limit:
            break
    return gen.result


def _logits(kind: str, n: int) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    special = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}
    if kind in special:
        x[n // 2] = special[kind]
    elif kind.startswith("-all") or kind.startswith("all"):
        x[:] = special[kind.replace("all", "")]
    elif kind == "huge":
        x *= np.float32(1e38)
    elif kind == "tiny":
        x *= np.float32(1e-44)
    elif kind == "mixed":
        x[::3], x[1::3] = np.inf, -np.inf
    return x


def scenario_gguf(case: dict, steps: Steps, tmp: Path) -> None:
    path = build_file(case, tmp)
    model = steps.run("load", archrun.load, path, backend=case.get("backend", "fast"))
    if model is _FAILED:
        steps.run("tokenizer_from_gguf", archrun.Tokenizer.from_gguf, path)
        return
    text = case.get("text", "hello")
    tok = steps.run("tokenizer", lambda: model.tokenizer)
    if tok is not _FAILED:
        ids = steps.run("encode", tok.encode, text, True, True)
        if ids is not _FAILED:
            steps.run("decode", tok.decode, ids)
    cache = steps.run("init_cache", model.init_cache, 8)
    if cache is not _FAILED:
        steps.run("forward_step", model.forward_step, [0, 1, 2], cache)
    opts = case.get("options", {})
    steps.run("generate", lambda: _drive(archrun.generate(model, [1, 2, 3], max_tokens=4, **opts)))
    steps.run("chat", lambda: _drive(archrun.chat(model, [{"role": "user", "content": text}], max_tokens=3, **opts)))


def _seed_dir() -> Path:
    """One folder per process for the seeds API cases load (removed at exit; the runner's worker
    also runs inside a temporary folder the runner removes)."""
    if not _SEED_DIR:
        _SEED_DIR.append(Path(tempfile.mkdtemp(prefix="archrun-fuzz-seeds-")))
        atexit.register(shutil.rmtree, _SEED_DIR[0], True)
    return _SEED_DIR[0]


def _model(seed: int, backend: str) -> Any:
    key = (seed % len(C.SEEDS), backend)
    if key not in _MODELS:
        m = parse(seed_bytes(seed))
        if m.get("tokenizer.chat_template") is None:
            m.kvs.append(KV("tokenizer.chat_template", 8, C.CHATML))
        path = _seed_dir() / f"seed{key[0]}-{key[1]}.gguf"
        path.write_bytes(serialize(m))
        _MODELS[key] = archrun.load(path, backend=backend)
    return _MODELS[key]


def scenario_template(case: dict, steps: Steps, tmp: Path) -> None:
    from archrun.text.chat_template import chat_tokens, render_chat

    messages = build_value(case["messages"])
    if case["via"] == "render":
        steps.run("render_chat", render_chat, case["template"], messages)
        return
    model = _model(case["seed"], "reference")
    steps.run("chat_tokens", chat_tokens, model.tokenizer, messages, template=case["template"])


def scenario_api(case: dict, steps: Steps, tmp: Path) -> None:
    from archrun.generation.sampling import Sampler, SamplingParams
    from archrun.text.chat_template import chat_tokens, render_chat

    model = _model(case["seed"], case["backend"])
    tok = model.tokenizer
    a, b, opts = build_value(case["a"]), build_value(case["b"]), build_value(case["options"])
    opts = opts if isinstance(opts, dict) else {}
    call = case["call"]
    if call == "generate":
        steps.run(call, lambda: _drive(archrun.generate(model, a, **opts)))
    elif call == "chat":
        steps.run(call, lambda: _drive(archrun.chat(model, a, **opts)))
    elif call == "encode":
        steps.run(call, tok.encode, a, *([b] if isinstance(b, bool) else []))
    elif call == "decode":
        steps.run(call, tok.decode, a)
    elif call == "token_to_piece":
        steps.run(call, tok.token_to_piece, a)
    elif call == "token_text":
        steps.run(call, tok.token_text, a)
    elif call == "incremental":
        dec = tok.incremental()
        steps.run(call, lambda: [dec.push(x) for x in (a if isinstance(a, list) else [a])])
    elif call == "init_cache":
        steps.run(call, model.init_cache, a)
    elif call == "forward_step":
        cache = model.init_cache(16)
        steps.run(call, model.forward_step, a, cache)
    elif call == "load":
        kwargs = {k: v for k, v in opts.items() if k in ("backend", "threads", "hints", "block_style")}
        steps.run(call, archrun.load, a, **kwargs)
    elif call == "sampler":
        sampling = {k: v for k, v in opts.items() if k in C.SAMPLING[:10]}
        sampler = steps.run("sampling_params", lambda: Sampler(SamplingParams(**sampling), model.descriptor.n_vocab))
        if sampler is not _FAILED:
            steps.run(call, sampler, _logits(case["logits"], model.descriptor.n_vocab), [1, 2, 2])
    elif call == "render_chat":
        steps.run(call, render_chat, b if isinstance(b, str) else C.CHATML, a)
    elif call == "chat_tokens":
        steps.run(call, chat_tokens, tok, a)
    elif call == "describe":
        from archrun.describe.compile import describe
        steps.run(call, describe, a)


def _special_path(kind: str, tmp: Path, seed: int) -> Path:
    p = tmp / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "devzero":
        return Path("/dev/zero")
    elif kind == "devnull":
        return Path("/dev/null")
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "symlink_loop":
        os.symlink(p, p)
    elif kind == "unreadable":
        p.write_bytes(seed_bytes(seed))
        p.chmod(0)
    elif kind == "missing":
        pass
    else:
        p.write_bytes(seed_bytes(seed))
    return p


def scenario_special(case: dict, steps: Steps, tmp: Path) -> None:
    what = case["what"]
    if what in ("truncate_after_load", "replace_after_load"):
        path = tmp / "model.gguf"
        path.write_bytes(seed_bytes(case["seed"]))
        model = steps.run("load", archrun.load, path, backend=case["backend"])
        if model is _FAILED:
            return
        if what == "truncate_after_load":
            size = path.stat().st_size
            os.truncate(path, case["pos"] % size)
        else:
            path.unlink()
            path.write_bytes(b"\x00" * 16)
        cache = steps.run("init_cache", model.init_cache, 8)
        if cache is not _FAILED:
            steps.run("forward_step", model.forward_step, [0, 1, 2], cache)
        steps.run("generate", lambda: _drive(archrun.generate(model, [1, 2], max_tokens=3, temperature=0.0)))
        return
    path = _special_path(what, tmp, case["seed"])
    steps.run("load", archrun.load, path, backend=case["backend"])
    from archrun.io.ggufset import open_gguf

    steps.run("open_gguf", lambda: open_gguf(path).close())
    steps.run("tokenizer_from_gguf", archrun.Tokenizer.from_gguf, path)


def scenario_cli(case: dict, steps: Steps, tmp: Path) -> None:
    from archrun import cli

    target = case["target"]
    if target == "mutated":
        path = build_file({"seed": case["seed"], "edits": [{"op": "tensor_values", "tensor": "#1", "value": "nan",
                                                            "pos": 0, "n": 1}]}, tmp)
    elif target == "seed":
        path = tmp / "model.gguf"
        path.write_bytes(seed_bytes(case["seed"]))
    else:
        path = _special_path(target, tmp, case["seed"])
    argv = [case["cmd"]] if case["cmd"] != "plugins" else ["plugins"]
    if case["cmd"] not in ("plugins", "bogus"):
        argv.append(str(path))
    if case["cmd"] == "run":
        argv += ["-p", case["prompt"], "-n", "2"]
    if case["cmd"] == "bench":
        argv += ["--prompt-tokens", "4", "--gen-tokens", "2"]
    argv += case["opts"]
    old_stdin = sys.stdin
    sys.stdin = io.StringIO("hello\n/exit\n")
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            steps.run("cli", cli.main, argv)
    finally:
        sys.stdin = old_stdin


def _host_model(seed: int) -> Any:
    """The seed on the host_reference block style (its host_step entry)."""
    key = (seed % len(C.SEEDS), "host_reference")
    if key not in _MODELS:
        path = _seed_dir() / f"seed{key[0]}-host.gguf"
        m = parse(seed_bytes(seed))
        if m.get("tokenizer.chat_template") is None:
            m.kvs.append(KV("tokenizer.chat_template", 8, C.CHATML))
        path.write_bytes(serialize(m))
        _MODELS[key] = archrun.load(path, backend="reference", block_style="host_reference")
    return _MODELS[key]


def _first_array(slot: Any) -> tuple[Any, str, np.ndarray] | None:
    """(holder, name, array) of the first array a cache slot keeps (attributes, a state dict, a pair's part)."""
    for holder in (vars(slot), *[v for v in vars(slot).values() if isinstance(v, dict)],
                   *[vars(v) for v in vars(slot).values() if hasattr(v, "__dict__") and hasattr(v, "nbytes")
                     and not isinstance(v, type)]):
        for name, value in holder.items():
            if isinstance(value, np.ndarray) and value.ndim:
                return holder, name, value
    return None


def _replace(cache: Any, other: Any, how: str) -> None:
    """Change a cache's internals after it was made (what `cross` cases then step)."""
    slot = cache.slots[-1]
    found = _first_array(slot)
    if how in ("bigger", "smaller", "dtype", "strided", "readonly", "reshaped", "mixer_array") and found is not None:
        holder, name, a = found
        if how == "bigger":
            holder[name] = np.zeros((a.shape[0] * 2 + 1, *a.shape[1:]), a.dtype)
        elif how == "smaller":
            holder[name] = np.zeros((max(a.shape[0] // 2, 1), *a.shape[1:]), a.dtype)
        elif how == "dtype":
            holder[name] = a.astype(np.float64 if a.dtype != np.float64 else np.float32)
        elif how == "strided":
            holder[name] = np.repeat(a, 2, axis=0)[::2]
        elif how == "readonly":
            a.flags.writeable = False
        elif how == "reshaped":
            a.shape = (a.shape[0], -1) if a.ndim > 2 else (-1,)
        else:
            holder[name] = a.copy()
    elif how == "slots_swapped" and other is not None:
        cache.slots[0], other.slots[0] = other.slots[0], cache.slots[0]
    elif how == "slots_list":
        cache.slots = cache.slots[:-1]
    elif how == "capacity":
        cache.capacity = cache.capacity * 4 + 7
    elif how == "length":
        cache._n = -3
    elif how == "kv_type":
        cache.kv_type = "q8_0" if cache.kv_type != "q8_0" else "f32"
    elif how == "owner":
        cache.owner = None
    elif how == "slot_none":
        cache.slots[0] = None


def _use(steps: Steps, use: str, model: Any, cache: Any, other: Any, n_vocab: int) -> None:
    """Step `model` on `cache` through one entry."""
    from archrun.generation import speculative
    from archrun.run.cache import PrefixCache

    ids = [1 % n_vocab, 2 % n_vocab]
    if use == "forward_step":
        steps.run(use, model.forward_step, ids, cache)
    elif use == "forward_step_hidden":
        steps.run(use, model.forward_step_hidden, ids, cache)
    elif use in ("batch", "batch_spans"):
        fn = model.forward_step_batch if use == "batch" else model.forward_step_batch_spans
        second = other if other is not None and other is not cache else model.init_cache(8)
        steps.run(use, fn, [ids[:1], ids], [cache, second])
    elif use == "generate":
        steps.run(use, lambda: _drive(archrun.generate(model, ids, max_tokens=3, cache=PrefixCache(cache))))
    elif use == "speculative":
        steps.run(use, lambda: _drive(speculative.generate(model, ids * 3, "lookup", max_tokens=4, temperature=0.0,
                                                           cache=PrefixCache(cache))))
    elif use == "rewind":
        steps.run(use, cache.rewind, 1)
    elif use == "checkpoint":
        steps.run(use, cache.checkpoint)
    elif use == "host_step":
        steps.run(use, _host_model(0).host_step, ids[:1], cache)


def scenario_cross(case: dict, steps: Steps, tmp: Path) -> None:
    """Objects made by one model used by another (or with replaced internals)."""
    from archrun.generation import speculative
    from archrun.generation.generate import Decoding, make_request
    from archrun.generation.grammar import Constraint, Grammar
    from archrun.generation.sampling import Sampler, SamplingParams
    from archrun.run.cache import PrefixCache

    a = steps.run("load_a", _model, case["a"], case["backend_a"])
    b = steps.run("load_b", _model, case["b"], case["backend_b"])
    if a is _FAILED or b is _FAILED:
        return
    na, nb = a.descriptor.n_vocab, b.descriptor.n_vocab
    what, use = case["what"], case["use"]
    if what in ("cache", "prefix_cache"):
        kv = {} if case["kv_type"] == "f32" else {"kv_type": case["kv_type"]}
        cache = steps.run("init_cache", a.init_cache, 16, **kv)
        other = steps.run("init_cache_b", b.init_cache, 16)
        if cache is _FAILED or other is _FAILED:
            return
        if case["prefill"]:
            steps.run("prefill", a.forward_step, [i % na for i in range(case["prefill"])], cache)
        if case["replace"]:
            _replace(cache, other, case["replace"])
        if what == "prefix_cache":
            prefix = PrefixCache(a.init_cache(16))
            prefix.cache = cache if case["replace"] != "prefix_cache_none" else None
            steps.run("generate", lambda: _drive(archrun.generate(b, [1 % nb, 2 % nb], max_tokens=3, cache=prefix)))
            return
        _use(steps, use, b, cache, other, nb)
        _use(steps, use, a, cache, other, na)
    elif what == "request":
        req = steps.run("make_request", make_request, a, [1 % na, 2 % na], max_tokens=3)
        if req is not _FAILED:
            dec = steps.run("decoding", Decoding, b.tokenizer, req, nb)
            if dec is not _FAILED:
                steps.run("accept", dec.accept, np.zeros(nb, np.float32))
            steps.run("decoding_a", lambda: Decoding(a.tokenizer, req, na).accept(np.zeros(nb, np.float32)))
    elif what == "speculation":
        req = steps.run("make_request", make_request, a, [1 % na, 2 % na], max_tokens=3)
        if req is not _FAILED:
            steps.run("speculation", speculative.Speculation, b, speculative.LookupDrafter(),
                      Decoding(a.tokenizer, req, na), 3, 16)
    elif what == "drafter":
        drafter = steps.run("drafter", speculative.ModelDrafter, a, a)
        if drafter is not _FAILED:
            steps.run("speculative", lambda: _drive(speculative.generate(b, [1 % nb, 2 % nb] * 3, drafter,
                                                                         max_tokens=4, temperature=0.0)))
    elif what == "grammar":
        con = steps.run("constraint", Constraint, Grammar.regex("[a-z]+"), a.tokenizer, na)
        if con is not _FAILED:
            steps.run("choose", con.choose, 1 % nb, np.zeros(nb, np.float32), lambda x: int(np.argmax(x)))
            steps.run("consume", con.consume, nb + case["prefill"])
    elif what == "sampler":
        sampler = steps.run("sampler", Sampler, SamplingParams(repetition_penalty=1.3), na)
        if sampler is not _FAILED:
            steps.run("sample", sampler, np.zeros(nb, np.float32), [nb - 1, nb + case["prefill"]])


def scenario_signature(case: dict, steps: Steps, tmp: Path) -> None:
    """A public function called with None or a value of the wrong type for one argument (the API walk)."""
    import support.api_walk as walk

    model = _model(case["seed"], case["backend"])
    targets = walk._targets(model, _host_model(case["seed"]))
    label, fn, base = targets[case["target"] % len(targets)]
    params = walk._parameters(fn, base)
    name, _default = params[case["param"] % len(params)]
    values = [None, *walk.hostile()]
    kwargs = {k: v.make() if isinstance(v, walk.Fresh) else v for k, v in base.items()}
    kwargs[name] = values[case["value"] % len(values)]
    steps.run(f"{label}({name})", lambda: walk._call(fn, kwargs))


def scenario_selftest(case: dict, steps: Steps, tmp: Path) -> None:
    """The harness's own check: each finding kind on demand (tests/api/test_fuzz.py)."""
    import signal
    import time

    what = case["what"]
    if what == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif what == "hang":
        time.sleep(3600)
    elif what == "untyped":
        steps.run("selftest", lambda: {}["missing"])
    elif what == "memory":
        steps.run("selftest", lambda: bytearray(1 << 42))
    elif what == "typed":
        steps.run("selftest", archrun.load, tmp / "absent.gguf")


SCENARIOS = {"selftest": scenario_selftest, "gguf": scenario_gguf, "template": scenario_template, "api": scenario_api,
             "special": scenario_special, "cli": scenario_cli, "cross": scenario_cross,
             "signature": scenario_signature}


def run_case(case: dict) -> dict:
    """Run one case in this process -> {"status": ok|typed|untyped, "steps": [...]}."""
    steps = Steps()
    tmp = Path(tempfile.mkdtemp(prefix="archrun-fuzz-"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                SCENARIOS[case["kind"]](case, steps, tmp)
            except ArchrunError as exc:  # building the case itself hit archrun (e.g. parse of a seed)
                steps.results.append({"step": "setup", "status": "typed", "type": type(exc).__name__,
                                      "message": str(exc)[:300]})
            except (MemoryError, RecursionError) as exc:
                steps.results.append({"step": "setup", "status": "untyped", "type": type(exc).__name__,
                                      "message": str(exc)[:300], "where": _where(exc)})
            except Exception as exc:  # noqa: BLE001 - a bug of the harness itself (building the case)
                steps.results.append({"step": "setup", "status": "harness", "type": type(exc).__name__,
                                      "message": str(exc)[:300], "where": _where(exc)})
    finally:
        with contextlib.suppress(OSError):
            for p in tmp.iterdir():
                if p.is_file() and not p.is_symlink():
                    p.chmod(stat.S_IRUSR | stat.S_IWUSR)
        shutil.rmtree(tmp, ignore_errors=True)
    statuses = [r["status"] for r in steps.results]
    status = next((s for s in ("untyped", "harness", "typed") if s in statuses), "ok")
    return {"status": status, "steps": steps.results}


# ---- the worker process ---------------------------------------------------------------------------

def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def warm_up() -> None:
    """Load every seed on both backends and run one quantized variant per type: kernels compile
    (or load from the cache) here, not inside a timed case."""
    for i in range(len(C.SEEDS)):
        for backend in ("fast", "reference"):
            with contextlib.suppress(ArchrunError):
                _model(i, backend)
    for i in range(len(C.SEEDS)):  # the entries `cross` cases step, on every kv type (their kernels compile here)
        for kv in ("f32", "f16", "q8_0"):
            with contextlib.suppress(ArchrunError):
                m = _model(i, "fast")
                caches = [m.init_cache(16, **({} if kv == "f32" else {"kv_type": kv})) for _ in range(2)]
                m.forward_step([1, 2, 3], caches[0])
                m.forward_step([1], caches[0])
                m.forward_step_hidden([2], caches[0])
                m.forward_step_batch_spans([[1, 2, 3], [4]], caches, all_logits=True)
                m.forward_step_batch([[1], [2]], caches)
    for q in C.QUANT_TYPES:
        run_case({"kind": "gguf", "seed": 0, "backend": "fast", "text": "hi", "options": {},
                  "edits": [{"op": "tensor_quantize", "tensor": f"#{k}", "type": q, "scales": "finite", "seed": 0}
                            for k in range(1, 9)]})


def main() -> None:
    memory_mib = int(sys.argv[sys.argv.index("--memory") + 1]) if "--memory" in sys.argv else 1024
    out = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    warm_up()
    limit = _vm_size() + memory_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out.write(json.dumps({"ready": True, "vm": _vm_size(), "limit": limit}) + "\n")
    for line in sys.stdin:
        case = json.loads(line)
        out.write(json.dumps(run_case(case)) + "\n")


if __name__ == "__main__":
    main()
