"""Stream a completion of a prompt from a GGUF model.

usage: python examples/generate.py MODEL.gguf [-p PROMPT] [-n MAX_TOKENS] [--temp T] [--seed S]
                                   [--backend fast|reference]

Prints the prompt, then the completion piece by piece as it is generated (--temp 0: greedy),
then a summary line on stderr.
"""

from __future__ import annotations

import argparse
import sys

import archrun


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stream a completion of a prompt from a GGUF model.")
    ap.add_argument("model", help="path of a .gguf file")
    ap.add_argument("-p", "--prompt", default="Once upon a time")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--temp", type=float, default=0.8, help="sampling temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--backend", choices=("fast", "reference"), default="fast")
    args = ap.parse_args(argv)

    model = archrun.load(args.model, backend=args.backend)
    gen = archrun.generate(model, args.prompt, max_tokens=args.max_tokens, temperature=args.temp, seed=args.seed)
    print(args.prompt, end="", flush=True)
    for piece in gen:  # text pieces, never a broken UTF-8 sequence
        print(piece, end="", flush=True)
    print()
    r = gen.result
    print(f"[{r.completion_tokens} tokens, finish: {r.finish_reason}, {r.timings['generate_tok_s']:.1f} tok/s]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
