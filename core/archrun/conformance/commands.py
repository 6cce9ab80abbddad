"""The Level 2 commands of the `archrun` command line: trace, diverge, recover (docs/level2.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away, there lived"


def add_commands(sub: Any) -> None:
    """Register `trace`, `diverge` and `recover` on the CLI's subparsers."""
    tr = sub.add_parser("trace", help="write a model's per-op activations on a prompt to a trace file")
    tr.add_argument("model", help="a .gguf file, or an HF model directory (traced with transformers)")
    tr.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="the prompt text")
    tr.add_argument("--out", required=True, help="the trace file to write (.npz)")
    tr.add_argument("--tokenizer", help="for an HF directory: the .gguf whose tokenizer makes the ids")
    _common(tr)
    tr.set_defaults(func=cmd_trace)
    dv = sub.add_parser("diverge", help="compare a model's trace with a reference trace, op by op")
    dv.add_argument("model", help="path to a .gguf file")
    dv.add_argument("--reference", required=True, help="a trace file (archrun trace)")
    dv.add_argument("--json", action="store_true", help="machine-readable output")
    _common(dv)
    dv.set_defaults(func=cmd_diverge)
    rc = sub.add_parser("recover", help="find the conventions that make a model match a reference")
    rc.add_argument("model", help="path to a .gguf file")
    rc.add_argument("--reference", required=True, help="a trace file, or an HF model directory")
    rc.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="the prompt an HF reference is traced on")
    rc.add_argument("--json", action="store_true", help="print the hints found as one JSON object on the last line")
    rc.add_argument("--package", help="write a family plugin package skeleton into this (new) folder")
    rc.add_argument("--budget", type=float, default=300.0, help="seconds the search may take (default 300)")
    _common(rc)
    rc.set_defaults(func=cmd_recover)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("fast", "reference"), default="reference",
                   help="op implementations (default: reference)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |err| / max(1, max |ref|) an op may differ")
    p.add_argument("--hint", action="append", default=[], metavar="NAME=VALUE",
                   help="a convention the file does not state (repeatable)")


def _hints(args: argparse.Namespace) -> dict[str, str] | None:
    from archrun.family import parse_hints

    return parse_hints(args.hint) or None


def cmd_trace(args: argparse.Namespace) -> int:
    from archrun.conformance import trace_format
    from archrun.errors import InvalidRequest

    model = Path(args.model)
    if model.is_dir():
        from archrun.conformance.recover import reference_trace

        if not args.tokenizer:
            raise InvalidRequest("tracing an HF directory needs --tokenizer GGUF (the file whose ids both runs read)")
        t = reference_trace(model, args.tokenizer, args.prompt)
    else:
        from archrun.conformance.recover import trace_gguf
        from archrun.text.tokenizer import Tokenizer

        ids = Tokenizer.from_gguf(model).encode(args.prompt)
        t = trace_gguf(model, ids, args.backend, hints=_hints(args))
    trace_format.save(t, args.out)
    print(f"{args.out}: {len(t.ops)} ops, {len(t.ids)} tokens ({t.producer})")
    return 0


def cmd_diverge(args: argparse.Namespace) -> int:
    from archrun.conformance import trace_format
    from archrun.conformance.diverge import compare
    from archrun.conformance.recover import trace_gguf

    ref = trace_format.load(args.reference)
    got = trace_gguf(args.model, ref.ids, args.backend, hints=_hints(args))
    report = compare(got, ref, args.tolerance)
    if args.json:
        first = report.first
        print(json.dumps({"matches": report.matches, "logits_rel": report.logits_rel,
                          "first": None if first is None else first.name,
                          "layers": [{"layer": e.layer, "op": e.op, "max_abs": e.max_abs, "rel": e.rel,
                                      "cosine": e.cosine} for e in report.per_layer()]}))
    else:
        print(report.table())
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from archrun.conformance.recover import recover, reference_trace

    ref = reference_trace(args.reference, args.model, args.prompt)
    start = None
    if args.hint:
        start = _start(args)
    found = recover(args.model, ref, backend=args.backend, tolerance=args.tolerance, budget=args.budget,
                    start=start)
    print(found.describe())
    if args.package:
        from archrun.conformance.package import write_package

        dest = write_package(found, args.package, args.model, ref, args.tolerance)
        print(f"wrote the family package {dest}")
    if args.json:
        print(json.dumps(found.stated()))
    return 0


def _start(args: argparse.Namespace) -> Any:
    """The family's hints (or the first guess) with the caller's --hint values on top."""
    from archrun.conformance.recover import starting_hints, vocab_names
    from archrun.io.ggufset import open_gguf
    from archrun.plugins import default_plugin_manager

    pm = default_plugin_manager()
    arch = str(open_gguf(args.model).metadata["general.architecture"])
    family = pm.hook.archrun_describe_family(architecture=arch)
    return starting_hints(arch, family, vocab_names(pm)).updated(_hints(args))
