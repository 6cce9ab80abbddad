"""The `archrun` command line: run, chat, serve, inspect, plugins, bench; trace, diverge, recover.

User errors (any ArchrunError, a missing file) print one line to stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from archrun.errors import ArchrunError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `archrun` script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except ArchrunError as e:
        print(f"archrun: error: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"archrun: error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="archrun", description="Run GGUF models: descriptor + weights -> model.")
    sub = p.add_subparsers(title="commands")
    run = sub.add_parser("run", help="generate text from a prompt (streams to stdout)")
    _model_args(run)
    run.add_argument("-p", "--prompt", required=True, help="the prompt text")
    run.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    run.add_argument("--system", help="system message (with --chat)")
    _sampling_args(run)
    _speculative_args(run)
    _kv_arg(run)
    run.add_argument("--hash", action="store_true",
                     help="print the FNV-1a hash of every step's logits and the system fingerprint to stderr "
                          "(equal on every run of the same model and prompt on one machine class)")
    run.set_defaults(func=_cmd_run)
    chat = sub.add_parser("chat", help="interactive chat (keeps history; Ctrl-D or /exit quits)")
    _model_args(chat)
    chat.add_argument("--system", help="system message")
    _sampling_args(chat)
    _kv_arg(chat)
    chat.set_defaults(func=_cmd_chat)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching")
    _model_args(serve, several=True)
    _serve_args(serve)
    _speculative_args(serve)
    _kv_arg(serve)
    serve.set_defaults(func=_cmd_serve)
    ins = sub.add_parser("inspect", help="print a model's descriptor and which plugin provides each op")
    ins.add_argument("model", help="path to a .gguf file")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--hint", action="append", default=[], metavar="NAME=VALUE",
                     help="a convention the file does not state (repeatable)")
    ins.set_defaults(func=_cmd_inspect)
    plg = sub.add_parser("plugins", help="list installed vocabulary and families")
    plg.add_argument("--json", action="store_true", help="machine-readable output")
    plg.set_defaults(func=_cmd_plugins)
    bench = sub.add_parser("bench", help="measure prefill/decode speed, load time and peak memory")
    _model_args(bench)
    bench.add_argument("--prompt-tokens", type=int, default=128)
    bench.add_argument("--gen-tokens", type=int, default=64)
    bench.add_argument("--repetitions", type=int, default=3,
                       help="timed runs after one untimed warm-up run, as llama-bench -r (the median is shown)")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    _kv_arg(bench)
    bench.set_defaults(func=_cmd_bench)
    warm = sub.add_parser("warmup", help="compile kernels into the kernel cache ahead of their first use")
    warm.add_argument("model", nargs="*", help="models (.gguf) to warm: their ops, fused blocks and head, one prefill "
                                               "and one decode step per --kv-type")
    warm.add_argument("--types", default=None, metavar="T,T,...",
                      help="weight types whose product kernels to compile, e.g. Q4_K,F16 ('all': every type the "
                           "kernels run; default: all when no model is given, else none beyond the models' own)")
    warm.add_argument("--no-plugins", action="store_true",
                      help="skip the plugins' fast ops (whose modules compile their kernels at import)")
    warm.add_argument("--kv-type", dest="kv_types", action="append", choices=("f32", "f16", "q8_0"), default=None,
                      help="cache types the models' decode steps run on (repeatable; default f32)")
    warm.set_defaults(func=_cmd_warmup)
    conf = sub.add_parser("conformance", help="the conformance kit: record a plugin package's goldens")
    conf_sub = conf.add_subparsers(title="conformance commands")
    rec = conf_sub.add_parser("record", help="record a package's fixtures from HF transformers "
                                             "(or check them in llama.cpp)")
    rec.add_argument("package", help="the package's archrun entry point (see `archrun plugins`)")
    rec.add_argument("--only", nargs="*", help="fixture names (default: all)")
    rec.add_argument("--llamacpp-check", action="store_true",
                     help="run the stored GGUFs in llama.cpp (needs llama-cpp-python) into llamacpp_check.json")
    rec.add_argument("--chains", action="store_true",
                     help="record only the greedy chains of the package's independent references (HF float32 for "
                          "tiny HF fixtures, a declared forward pass for synthetic variants) into goldens/")
    rec.add_argument("--hashes", action="store_true",
                     help="record the logit-bit hashes of archrun's own output for this machine class "
                          "(tests/logit_hashes/; a regression pin, not a correctness golden)")
    rec.set_defaults(func=_cmd_conformance_record)
    from archrun.conformance.commands import add_commands  # trace, diverge, recover (docs/level2.md)

    add_commands(sub)
    return p


def _model_args(p: argparse.ArgumentParser, several: bool = False) -> None:
    if several:
        p.add_argument("model", nargs="*", help="paths to .gguf files (a request's `model` picks one by file name)")
    else:
        p.add_argument("model", help="path to a .gguf file")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")
    p.add_argument("--backend", choices=("fast", "reference"), default=None,
                   help="op implementations (default: fast; while a model's fast kernels are not compiled yet, "
                        "the reference ops answer and the kernels compile in the background)")
    p.add_argument("--block-style", default=None, help="a registered block style (see `archrun plugins`)")
    p.add_argument("--hint", action="append", default=[], metavar="NAME=VALUE",
                   help="a convention the file does not state, e.g. rope_pairing=norm (repeatable)")
    p.add_argument("--lora", action="append", default=[], metavar="PATH[:SCALE]",
                   help="a LoRA adapter (GGUF) merged into the weights at load, scaled by SCALE (default 1; "
                        "repeatable)")
    p.add_argument("--expert-memory", default=None, metavar="SIZE",
                   help="keep at most SIZE (e.g. 4G) of a MoE model's experts in memory; the others are paged in "
                        "from disk when picked (docs/scaling.md)")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--temp", "--temperature", dest="temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", dest="repetition_penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--json-schema", metavar="FILE", default=None,
                   help="constrain the output to JSON valid under the JSON Schema in FILE")


def _speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", metavar="DRAFTER", default=None,
                   help="decode speculatively: lookup (n-gram match in prompt and output), draft:PATH (a smaller "
                        "model with the same vocabulary), mtp (the model's next-n head), or a plugin's drafter")
    p.add_argument("--draft-max", type=int, default=5, help="most tokens drafted per verify step (5)")


def _serve_args(p: argparse.ArgumentParser) -> None:
    from archrun.serve.config import ServeConfig

    d = ServeConfig()
    p.add_argument("--host", default=d.host, help=f"address to listen on ({d.host})")
    p.add_argument("--port", type=int, default=d.port, help=f"port ({d.port})")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $ARCHRUN_API_KEY, else no key)")
    p.add_argument("--parallel", type=int, default=d.parallel, help=f"sequences decoded together ({d.parallel})")
    p.add_argument("--ctx", type=int, default=None, help="context of each sequence (default: min(model's, 4096))")
    p.add_argument("--queue", type=int, default=d.queue, help=f"requests that may wait for a slot ({d.queue})")
    p.add_argument("--prefill-chunk", type=int, default=d.prefill_chunk,
                   help="prompt tokens computed per step (default: automatic: a whole prompt of up to 512 "
                        "tokens when nothing else decodes, else about one decode step's worth, measured)")
    p.add_argument("--max-body", type=int, default=d.max_body, help=f"request body limit in bytes ({d.max_body})")
    p.add_argument("--model-name", default=None, help="the model id clients see (default: the file's name)")
    p.add_argument("--models-dir", default=None, metavar="DIR",
                   help="serve every .gguf file in DIR too (each loads on its first request)")
    p.add_argument("--max-memory", default=None, metavar="BYTES",
                   help="bound on the loaded models' weights and KV caches together, e.g. 8GB or 6GiB: the least "
                        "recently used idle model is unloaded to make room; a request that cannot get memory "
                        "is answered 503 (default: no bound)")
    p.add_argument("--max-kv", default=None, metavar="BYTES",
                   help="bound on each model's KV caches, e.g. 512MB (a request needing more: 400; default: none)")
    p.add_argument("--watchdog", type=float, default=d.watchdog,
                   help=f"seconds an inference step may run before /health answers 503 ({d.watchdog:g})")
    p.add_argument("--reasoning-budget", type=int, default=None,
                   help="most thinking tokens of a chat reply unless the request says (-1: no bound, the default; "
                        "0: thinking off)")
    p.add_argument("--pooling", choices=("mean", "cls", "last"), default=None,
                   help="how /v1/embeddings pools a sequence's hidden states (default: as the file states; "
                        "decoder files state none)")
    p.add_argument("--ray", action="store_true",
                   help="serve --replicas N replicas as a Ray Serve deployment (needs 'archrun[ray]')")
    p.add_argument("--replicas", type=int, default=1, help="model replicas with --ray (1)")
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH[:SCALE]",
                   help="also serve the model with this LoRA adapter merged, as model NAME (a request's `model` "
                        "or `lora` picks it; repeatable)")
    p.add_argument("--stages", type=int, default=None,
                   help="with --ray: run the model's blocks as K pipeline stages on K Ray actors (docs/scaling.md)")
    p.add_argument("--ray-address", default=None,
                   help="with --ray: the cluster to join ('auto' for the local node's; default: start a local one)")


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "max_tokens", "stop")
    options = {k: getattr(args, k) for k in keys}
    if args.json_schema is not None:
        from archrun.generation.grammar import Grammar

        with open(args.json_schema, encoding="utf-8") as f:
            options["grammar"] = Grammar.json_schema(f.read())  # checked before the model loads
    return options


def _kv_arg(p: argparse.ArgumentParser) -> None:
    from archrun.run.cache import KV_TYPES

    p.add_argument("--kv-type", choices=KV_TYPES, default="f32",
                   help="how the KV cache stores keys and values: f32 (default), f16 (half the memory) or q8_0 "
                        "(ggml's 8-bit blocks, ~0.27 of f32)")


def _load(args: argparse.Namespace, path: Any = None, lora: list | None = None, share: Any = None,
          tiered: bool = True):
    """The model of args.model (or of `path`), loaded with the command's options (adapters: `lora`, else
    the command's --lora; `share`: a model of the same file whose weights it reuses where they are not
    adapted; tiered False: the fast model, never a tiered start)."""
    path = args.model if path is None else path
    from archrun.api import load
    from archrun.family import parse_hints
    from archrun.progress import LoadProgress

    with LoadProgress() as progress:
        kwargs = dict(block_style=args.block_style, hints=parse_hints(args.hint), threads=args.threads,
                      progress=progress)
        lora = _lora(args) if lora is None else lora
        if lora:
            kwargs["lora"] = lora
        experts = _expert_memory(args)
        if experts is not None:
            kwargs["expert_memory"] = experts
        if share is not None:
            kwargs["share_weights_with"] = share
        # fast, or tiered while its kernels compile (ARCHRUN_TIERED=0: wait for them instead)
        # (not for --hash: a tiered start's first tokens come from the reference backend; not with adapters
        # or streamed experts, which need the fast backend)
        tiered_ok = not getattr(args, "hash", False) and os.environ.get("ARCHRUN_TIERED", "1") != "0" and not lora \
            and experts is None and tiered
        if args.backend is None and args.block_style is None and tiered_ok:
            from archrun.run import tiered

            return tiered.load(path, **kwargs)
        return load(path, backend=args.backend, **kwargs)


def _adapter_models(args: argparse.Namespace, files: list) -> dict[str, Any]:
    """serve --adapter NAME=PATH[:SCALE]: a loader per NAME of the (single) model with that adapter merged,
    reusing the base model's weights where the adapter changes nothing (and one of the base itself, loaded
    once: the adapters' models share it)."""
    import functools

    from archrun.errors import InvalidRequest
    from archrun.io.lora import parse_lora_arg

    loaders: dict[str, Any] = {}
    base = str(files[0][1]) if files else ""
    shared_base = functools.cache(lambda: _load(args, base, tiered=False))
    for spec in args.adapter:
        name, sep, rest = spec.partition("=")
        if not sep or not name or not rest:
            raise InvalidRequest(f"--adapter takes NAME=PATH[:SCALE], got {spec[:80]!r}")
        if len(files) != 1:
            raise InvalidRequest("--adapter serves adapters of one base model: give one model file")
        if name in loaders or name == files[0][0]:
            raise InvalidRequest(f"--adapter: the name {name!r} is taken")
        path, scale = parse_lora_arg(rest)
        if not os.path.isfile(path):
            raise InvalidRequest(f"--adapter {name}: no adapter file at {path!r}")
        adapter = [(os.path.abspath(path), scale)]
        loaders[name] = lambda adapter=adapter: _load(args, base, lora=adapter, share=shared_base())
    if loaders and args.ray:
        raise InvalidRequest("--adapter serves from one process: it cannot be combined with --ray")
    if loaders:
        if _lora(args):
            raise InvalidRequest("--adapter serves the base model as it is: give its adapters with --adapter, "
                                 "not --lora")
        loaders[files[0][0]] = shared_base
    return loaders


def _expert_memory(args: argparse.Namespace) -> int | None:
    from archrun.serve.memory import parse_bytes

    value = getattr(args, "expert_memory", None)
    return None if value is None else parse_bytes(value)


def _lora(args: argparse.Namespace) -> list[tuple[str, float]]:
    from archrun.io.lora import parse_lora_arg

    return [(os.path.abspath(path), scale) for path, scale in map(parse_lora_arg, getattr(args, "lora", None) or [])]


def _stream(gen) -> None:
    for piece in gen:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def _cmd_run(args: argparse.Namespace) -> int:
    import archrun

    options, chat, generate = _sampling(args), archrun.chat, archrun.generate
    options["kv_type"] = args.kv_type
    if args.hash:
        options["logit_hashes"] = True
    model = _load(args)
    if args.speculative is not None:
        from archrun.generation import speculative

        chat, generate = speculative.chat, speculative.generate
        options.update(drafter=args.speculative, draft_max=args.draft_max)
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        msgs.append({"role": "user", "content": args.prompt})
        gen = chat(model, msgs, **options)
    else:
        gen = generate(model, args.prompt, **options)
    _stream(gen)
    if args.speculative is not None:
        _print_speculation(gen.result.timings)
    if args.hash:
        from archrun.generation.fingerprint import system_fingerprint

        print(f"system_fingerprint: {system_fingerprint(model)}", file=sys.stderr)
        print(f"logit_hashes: {' '.join(gen.result.logit_hashes)}", file=sys.stderr)
    return 0


def _print_speculation(t: dict[str, float]) -> None:
    """One line on stderr: decode speed and how well the drafts did."""
    print(f"speculative: {t['generate_tok_s']:.1f} tok/s, acceptance {t['spec_acceptance']:.0%}, "
          f"{t['spec_tokens_per_step']:.2f} tokens per verify step", file=sys.stderr)


def _cmd_chat(args: argparse.Namespace) -> int:
    import archrun
    from archrun.run.cache import PrefixCache, kv_options

    options = _sampling(args)
    model = _load(args)
    history = [{"role": "system", "content": args.system}] if args.system else []
    # kept between turns: a turn computes only its new tokens
    cache = PrefixCache(model.init_cache(**kv_options(args.kv_type)))
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            return 0
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        gen = archrun.chat(model, history, cache=cache, **options)
        try:
            _stream(gen)
        except KeyboardInterrupt:  # stop this answer, keep the session
            print(file=sys.stderr)
            history.pop()
            continue
        history.append({"role": "assistant", "content": gen.result.text})


def _cmd_serve(args: argparse.Namespace) -> int:
    import os

    from archrun.errors import InvalidRequest
    from archrun.family import parse_hints
    from archrun.serve.config import ServeConfig
    from archrun.serve.memory import parse_bytes
    from archrun.serve.models import model_files

    key = args.api_key if args.api_key is not None else os.environ.get("ARCHRUN_API_KEY")
    budget = None if args.reasoning_budget is None or args.reasoning_budget == -1 else args.reasoning_budget
    config = ServeConfig(host=args.host, port=args.port, api_key=key,
                         parallel=args.parallel, ctx=args.ctx, queue=args.queue, prefill_chunk=args.prefill_chunk,
                         max_body=args.max_body, model_name=args.model_name,
                         speculative=args.speculative, draft_max=args.draft_max,
                         kv_type=args.kv_type, watchdog=args.watchdog, reasoning_budget=budget,
                         max_memory=None if args.max_memory is None else parse_bytes(args.max_memory),
                         max_kv=None if args.max_kv is None else parse_bytes(args.max_kv),
                         pooling=args.pooling,
                         )  # validated before the model loads
    files = model_files(args.model, args.models_dir, args.model_name)
    loaders = _adapter_models(args, files)
    if len(files) > 1 or loaders:
        if args.ray:
            raise InvalidRequest("--ray serves one model")
        import uvicorn

        from archrun.serve.front import create_pool_app

        files += [(name, files[0][1]) for name in loaders if name != files[0][0]]
        app = create_pool_app(files, lambda path: _load(args, path), config, loaders)
        uvicorn.run(app, host=config.host, port=config.port, log_level="info", timeout_graceful_shutdown=5)
        return 0
    args.model = str(files[0][1])
    if args.stages is not None and not args.ray:
        raise InvalidRequest("--stages places pipeline stages on Ray actors: it needs --ray")
    if args.ray:
        from archrun.serve import ray

        load_options = dict(threads=args.threads, backend=args.backend, block_style=args.block_style,
                            hints=parse_hints(args.hint), lora=_lora(args), expert_memory=_expert_memory(args))
        if args.stages is not None:
            if args.replicas != 1:
                raise InvalidRequest("--stages and --replicas cannot be combined: serve one pipeline")
            ray.run_stages(args.model, config, args.stages, args.ray_address, load_options)
            return 0
        ray.run(args.model, config, args.replicas, args.ray_address, load_options)
        return 0
    from archrun.serve import serve

    serve(_load(args), config, model_path=args.model)
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from archrun.describe.inspect import inspect_model, render_text
    from archrun.family import parse_hints

    info = inspect_model(args.model, parse_hints(args.hint))
    print(json.dumps(info, indent=2) if args.json else render_text(info))
    return 0


def _cmd_plugins(args: argparse.Namespace) -> int:
    from archrun.describe.inspect import list_plugins, render_plugins

    info = list_plugins()
    print(json.dumps(info, indent=2) if args.json else render_plugins(info))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from archrun.benchmark import render_bench, run_bench

    result = run_bench(args.model, threads=args.threads, backend=args.backend, block_style=args.block_style,
                       prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens, kv_type=args.kv_type,
                       repetitions=args.repetitions)
    print(json.dumps(result, indent=2) if args.json else render_bench(result))
    return 0


def _cmd_warmup(args: argparse.Namespace) -> int:
    from archrun.run.warmup import warm_models, warm_plugins, warm_types, weight_types

    types = weight_types(args.types if args.types is not None or args.model else "all")
    for path in args.model:
        if not os.path.isfile(path):
            raise FileNotFoundError(2, "No such file", path)
    from archrun.progress import LoadProgress

    with LoadProgress() as progress:
        if not args.no_plugins:
            warm_plugins()
        warm_types(types, progress)
        warm_models(args.model, args.kv_types or ["f32"], progress)
    return 0


def _cmd_conformance_record(args: argparse.Namespace) -> int:
    from archrun.conformance import hf

    if args.hashes:
        from archrun.conformance.kit import record_package_hashes

        for path in record_package_hashes(args.package):
            print(f"wrote {path}")
        return 0
    if args.chains:
        from archrun.conformance.kit import record_package_reference_chains

        for path in record_package_reference_chains(args.package):
            print(f"wrote {path}")
    argv = (["--only", *args.only] if args.only else []) + (["--llamacpp-check"] if args.llamacpp_check else []) \
        + (["--chains"] if args.chains else [])
    if args.chains and not _has_hf_fixtures(args.package):
        return 0
    hf.record_package(args.package, argv)
    return 0


def _has_hf_fixtures(package: str) -> bool:
    from archrun.conformance import hf
    from archrun.errors import InvalidRequest

    try:
        return bool(hf.package_fixture_specs(package))
    except InvalidRequest:
        return False


if __name__ == "__main__":
    sys.exit(main())
