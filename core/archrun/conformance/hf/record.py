"""A family's goldens: HF float32 logits for every fixture (and MTP logits when the arch has an MTP head),
the converted GGUF, optionally llama.cpp's logits on it (``llamacpp_check.json``); ``record_main`` is a
family's ``tests/goldens/record.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from archrun.conformance import chains
from archrun.conformance.hf.convert import config_json, convert
from archrun.conformance.hf.goldens import check_fixture, load_golden
from archrun.conformance.hf.models import HfArch, TinyFixture, build_tiny, load_module
from archrun.conformance.limits import N_TOKENS

MAX_GGUF_BYTES = 1_000_000  # per fixture


MAX_TOTAL_BYTES = 10_000_000  # per goldens folder


def fixture_ids(name: str, n_vocab: int) -> np.ndarray:
    """The fixed random token sequence (N_TOKENS ids, specials excluded) of fixture ``name``."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.integers(0, n_vocab - 2, size=N_TOKENS).astype(np.int32)


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": _dist_version("gguf", gguf),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


def _dist_version(dist: str, module) -> str:
    from importlib.metadata import version

    return getattr(module, "__version__", None) or version(dist)


def hf_logits(model, ids: np.ndarray):
    """(logits [n, vocab], final hidden states [n, n_embd]) of the HF model, float32."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
    return out.logits[0].float().numpy(), out.hidden_states[-1]


def hf_mtp_logits(model, ids: np.ndarray, hidden) -> np.ndarray:
    """MTP layer-0 logits [n-1, vocab] of ``model.archrun_mtp``.

    Row j is HF ``MtpModel`` layer 0 fed the embedding of ``ids[j+1]`` at position ``j+1`` and
    the trunk's final hidden state at position ``j`` (after the output norm, as transformers'
    MTPCandidateGenerator and llama.cpp's ``h_nextn`` both use it); it predicts ``ids[j+2]``.
    Attention inside the MTP block sees MTP rows 0..j only.
    """
    import torch

    mtp = model.archrun_mtp
    ids_t = torch.from_numpy(ids.astype(np.int64))[None]
    positions = torch.arange(1, len(ids))[None]
    with torch.no_grad():
        h = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=ids_t[:, 1:])
        return mtp._project_to_logits(h)[0].float().numpy()


def arch_of(arches: Sequence[HfArch], fixture: TinyFixture) -> HfArch:
    """The HfArch a fixture names: by HF model type first (several HF types may convert to one
    GGUF architecture, e.g. mistral to llama), else by GGUF architecture name."""
    for key in ("model_type", "name"):
        for arch in arches:
            if getattr(arch, key) == fixture.arch:
                return arch
    raise KeyError(f"fixture {fixture.name!r}: no HfArch named {fixture.arch!r}")


def record(arch: HfArch, fixture: TinyFixture, out_dir: Path, vers: dict[str, str]) -> Path:
    """Build, run and convert one fixture; write its .gguf and .npz into ``out_dir``; return the .npz path.

    ``<name>.gguf``: the converted model, all tensors F32. ``<name>.npz``: ``ids`` int32 [n];
    ``logits`` float32 [n, n_vocab] (HF, every position); with an MTP head ``mtp_logits`` float32
    [n-1, n_vocab] (``hf_mtp_logits``); ``config_json`` (HF config dict), ``fixture_json``
    (name/arch/seed/overrides, gguf file name and sha256), ``versions_json``.
    """
    name = fixture.name
    model, config = build_tiny(arch, fixture.seed, **fixture.overrides)
    ids = fixture_ids(name, config.vocab_size)
    logits, hidden = hf_logits(model, ids)
    arrays = {"ids": ids, "logits": logits}
    if getattr(model, "archrun_mtp", None) is not None:
        arrays["mtp_logits"] = hf_mtp_logits(model, ids, hidden)
    cfg_json = config_json(config)  # before converting: saving the model adds fields to its config
    gguf_path = convert(model, out_dir / f"{name}.gguf", arch, name=f"tiny-{name}")
    size = gguf_path.stat().st_size
    if size > MAX_GGUF_BYTES:
        raise SystemExit(f"{gguf_path.name} is {size} bytes (> {MAX_GGUF_BYTES}): shrink the fixture")
    meta = {"name": name, "arch": arch.name, "seed": fixture.seed, "overrides": dict(fixture.overrides),
            "n_tokens": N_TOKENS, "gguf": gguf_path.name, "gguf_sha256": _sha256(gguf_path)}
    out = out_dir / f"{name}.npz"
    np.savez_compressed(out, **arrays, config_json=np.array(cfg_json),
                        fixture_json=np.array(json.dumps(meta, sort_keys=True)),
                        versions_json=np.array(json.dumps(vers, sort_keys=True)))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def llamacpp_check(arches: Sequence[HfArch], fixtures: Sequence[TinyFixture], out_dir: Path) -> dict[str, dict]:
    """Run each stored GGUF through llama.cpp (F32 KV cache) and compare its logits with the stored HF ones."""
    import tempfile

    import llama_cpp

    from archrun.conformance.gguf_edit import rewrite_gguf

    report = {}
    tmp = Path(tempfile.mkdtemp())
    for fixture in fixtures:
        name, arch = fixture.name, arch_of(arches, fixture)
        if fixture.llama_cpp:
            print(f"{name:32s} not run in llama.cpp: {fixture.llama_cpp}")
            continue
        golden = np.load(out_dir / f"{name}.npz")
        ids = golden["ids"].tolist()
        path = out_dir / f"{name}.gguf"
        added = arch.llamacpp_keys
        if callable(added):
            added = added(json.loads(str(golden["config_json"])))
        if added:
            path = rewrite_gguf(path, tmp / path.name, add_keys={f"{arch.name}.{k}": v for k, v in added.items()})
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=64, n_threads=2,
                              n_batch=64, type_k=0, type_v=0, verbose=False)  # F32 KV cache
        llm.eval(ids)
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        diff = float(np.abs(scores - golden["logits"]).max())
        agree = scores.argmax(-1) == golden["logits"].argmax(-1)
        argmax = float(agree.mean())
        report[name] = {"max_abs_diff": diff, "argmax_agreement": argmax,
                        "argmax_mismatch_positions": np.flatnonzero(~agree).tolist(),
                        "gguf_sha256": _sha256(out_dir / f"{name}.gguf")}
        if added:
            report[name]["keys_added_for_llama_cpp"] = dict(added)
        print(f"{name:32s} max|llama.cpp-HF| = {diff:.3e}  argmax agreement {argmax:.3f}")
        del llm
    report["_versions"] = {"llama_cpp_python": llama_cpp.__version__}
    return report


def record_main(arches: Sequence[HfArch], fixtures: Sequence[TinyFixture], out_dir: str | Path,
                argv: list[str] | None = None) -> None:
    """Command line of a family's ``tests/goldens/record.py``: record ``fixtures`` into ``out_dir``.

    ``--only NAME ...`` records some fixtures (and their greedy chains, ``archrun.conformance.chains``);
    ``--chains`` only the greedy chains of the stored fixtures; ``--llamacpp-check`` (in a venv with
    llama-cpp-python) writes ``llamacpp_check.json``: max |llama.cpp - HF| logits per fixture.
    """
    parser = argparse.ArgumentParser(description="Record HF goldens of tiny fixtures: " + str(out_dir))
    parser.add_argument("--only", nargs="*", help="fixture names (default: all)")
    parser.add_argument("--llamacpp-check", action="store_true", help="compare stored GGUFs in llama.cpp")
    parser.add_argument("--chains", action="store_true", help="record only the greedy chains of HF float32 "
                        "(greedy_chains.json) for the stored fixtures")
    args = parser.parse_args(argv)
    out_dir = Path(out_dir)
    by_name = {f.name: f for f in fixtures}
    entries = [by_name[n] for n in args.only] if args.only else list(fixtures)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.llamacpp_check:
        report = llamacpp_check(arches, entries, out_dir)
        (out_dir / "llamacpp_check.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return
    if args.chains:
        print("wrote", record_chains(arches, entries, out_dir))
        return
    import torch

    torch.set_num_threads(2)
    vers = versions()
    for fixture in entries:
        print("recorded", record(arch_of(arches, fixture), fixture, out_dir, vers).name)
    print("wrote", record_chains(arches, entries, out_dir))  # the greedy chains of the new files
    total = _total_bytes(out_dir)
    if total > MAX_TOTAL_BYTES:
        raise SystemExit(f"{out_dir} holds {total} bytes (> {MAX_TOTAL_BYTES})")
    print(f"total {total} bytes")


def package_root(entry_point: str) -> Path:
    """The source folder of the installed plugin package whose archrun entry point is ``entry_point``
    (its ``tests/`` lives there in a source or editable install); InvalidRequest when not installed."""
    import importlib.util
    from importlib.metadata import entry_points

    from archrun.errors import InvalidRequest

    eps = {ep.name: ep for ep in entry_points(group="archrun")}
    if entry_point not in eps:
        raise InvalidRequest(f"no installed archrun plugin {entry_point!r} (installed: {', '.join(sorted(eps))})")
    module = eps[entry_point].value.split(":")[0].split(".")[0]
    spec = importlib.util.find_spec(module)
    origin = Path(spec.origin if spec and spec.origin else "")
    return origin.parent.parent  # <package root>/<module>/__init__.py


def package_fixture_specs(entry_point: str) -> list[Path]:
    """The fixture declarations (``tests/**/hf_arch.py``) of the installed plugin package whose
    archrun entry point is ``entry_point``; InvalidRequest when it is not installed or declares none."""
    from archrun.errors import InvalidRequest

    root = package_root(entry_point)
    found = sorted((root / "tests").rglob("hf_arch.py")) if (root / "tests").is_dir() else []
    if not found:
        raise InvalidRequest(f"plugin {entry_point!r} ({root}) declares no fixtures: no tests/**/hf_arch.py "
                             "with ARCHES and FIXTURES (see docs/conformance.md)")
    return found


def record_package(entry_point: str, argv: list[str] | None = None) -> None:
    """``archrun conformance record PACKAGE``: record (or ``--llamacpp-check``) every fixture a plugin
    package declares into the ``goldens/`` folder beside each of its ``hf_arch.py`` files."""
    for spec_path in package_fixture_specs(entry_point):
        spec = load_module(spec_path)
        print(f"{entry_point}: {spec_path}")
        record_main(spec.ARCHES, spec.FIXTURES, spec_path.parent / "goldens", argv)


def record_chains(arches: Sequence[Any], fixtures: Sequence[Any], goldens: Path) -> Path:
    """Greedy chains of HF float32 for ``fixtures`` (rebuilt with ``build_tiny``) into ``goldens``.

    Refuses (InvalidRequest, nothing written) when a rebuilt model does not reproduce the recorded HF
    logits (the chain would come from another model than the file's) or archrun's logits on the file
    are off HF's (``check_fixture``)."""
    import torch

    from archrun.errors import InvalidRequest

    torch.set_num_threads(2)
    goldens = Path(goldens)
    vers = {**versions(), "reference": "HF transformers float32 (model(ids).logits, no cache)"}
    entries = {}
    for fixture in fixtures:
        name = fixture.name
        gguf_path = goldens / f"{name}.gguf"
        golden = load_golden(gguf_path.with_suffix(".npz"))
        model, _ = build_tiny(arch_of(arches, fixture), fixture.seed, **fixture.overrides)
        model.eval()
        logits, _ = hf_logits(model, golden["ids"])
        err = float(np.abs(logits - golden["logits"]).max())
        problems = []
        if err > 1e-4:
            problems.append(f"the rebuilt HF model is {err:.2e} from the recorded HF logits")
        if _sha256(gguf_path) != golden["fixture"]["gguf_sha256"]:
            problems.append("the GGUF is not the recorded one")
        try:
            check_fixture(gguf_path, "reference")
        except AssertionError as e:
            problems.append(f"archrun is off HF ({e})")
        if problems:
            raise InvalidRequest(f"not recording the greedy chain of {name}: {'; '.join(problems)}")
        chain = chains.reference_chain(chains.hf_step(model), golden["ids"][:chains.N_PROMPT].tolist())
        entries[chains.key("hf", name)] = {**chain, "input_sha256": _sha256(gguf_path), "reference": "HF",
                                           "versions": vers}
        print(f"chain {name}: {chain['tokens']}")
    return chains.write(goldens, entries, vers)


def record_here(record_py: str | Path) -> None:
    """A family's ``tests/goldens/record.py``: ``record_main`` for the fixtures of ``../hf_arch.py``
    into the script's folder (``--only NAME ...``, ``--llamacpp-check``)."""
    here = Path(record_py).resolve().parent
    spec = load_module(here.parent / "hf_arch.py")
    record_main(spec.ARCHES, spec.FIXTURES, here)


def _total_bytes(out_dir: Path) -> int:
    return sum(p.stat().st_size for p in out_dir.iterdir() if p.suffix in (".gguf", ".npz", ".json"))
