"""Greedy speculative decoding with a glm4moe model's MTP (nextn) head: draft, then verify.

usage: python examples/mtp_draft_verify.py GLM4MOE.gguf [-p PROMPT] [-n TOKENS] [-k DRAFTS]

Each round the MTP head drafts k tokens after the last one (MtpHead.propose); one trunk step
over [last, *drafts] verifies them all (archrun_glm4moe.verify): the drafts the trunk agrees
with are kept, the rest is rewound from both caches, and the trunk's own next token is added.
Prints the accepted drafts of every round, then checks that the tokens equal plain greedy
decoding (one trunk step per token); exits 1 if they do not. Any glm4moe file with
nextn_predict_layers > 0 works, e.g. families/archrun-glm4moe/tests/goldens/glm4moe_base.gguf.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import archrun
from archrun_glm4moe import MtpHead, verify


def speculative(model, head: MtpHead, prompt: list[int], n: int, k: int) -> tuple[list[int], int]:
    """n greedy tokens after prompt, drafted k at a time; (tokens, drafts accepted in all)."""
    size = len(prompt) + n + k + 1
    cache, mtp = model.init_cache(size), head.init_cache(size)
    tok = int(np.argmax(model.host_step(prompt, cache, mtp).logits[-1]))  # the mtp cache follows the trunk
    out, n_accepted, rnd = [tok], 0, 0
    while len(out) < n:
        drafts = head.propose(mtp, tok, k)
        accepted, logits = verify(model, cache, mtp, tok, drafts)
        tok = int(np.argmax(logits))  # the trunk's token after the last accepted draft
        out += [*accepted, tok]
        n_accepted += len(accepted)
        print(f"round {rnd}: drafted {drafts}, accepted {len(accepted)}/{k} {accepted}, then {tok}", flush=True)
        rnd += 1
    return out[:n], n_accepted


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after prompt, one trunk step per token."""
    cache = model.init_cache(len(prompt) + n)
    logits, out = model.host_step(prompt, cache).logits[-1], []
    while len(out) < n:
        out.append(int(np.argmax(logits)))
        logits = model.host_step([out[-1]], cache).logits[-1]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Greedy MTP draft-and-verify decoding of a glm4moe model.")
    ap.add_argument("model", help="path of a glm4moe .gguf file with an MTP head")
    ap.add_argument("-p", "--prompt", default="The quick brown fox")
    ap.add_argument("-n", "--tokens", type=int, default=16, help="tokens to generate")
    ap.add_argument("-k", "--drafts", type=int, default=2, help="draft tokens per round")
    args = ap.parse_args(argv)

    model = archrun.load(args.model, block_style="host_reference")  # MTP heads run on the host-side block style
    head = MtpHead(model)
    prompt = model.tokenizer.encode(args.prompt)
    spec, n_accepted = speculative(model, head, prompt, args.tokens, args.drafts)
    plain = greedy(model, prompt, args.tokens)
    print(f"speculative: {spec}")
    print(f"greedy:      {plain}")
    print(f"accepted {n_accepted} drafts; {len(spec)} tokens")
    if spec != plain:
        print("MISMATCH: speculative decoding differs from plain greedy decoding", file=sys.stderr)
        return 1
    print("speculative decoding equals plain greedy decoding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
