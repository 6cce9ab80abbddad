"""A tiny Gemma 4 assistant (HF ``Gemma4AssistantForCausalLM``, GGUF ``gemma4-assistant``) paired with three
target fixtures of ../hf_arch.py, and HF's drafts on each: the goldens of the ``gemma4-assistant`` drafter.
``gemma4_dense`` (its last two layers hold the keys and values the assistant reads), ``gemma4_kv_shared``
(KV-sharing layers after them, a sliding window of 4: the assistant's window 6 reads 7 rows of its ring)
and ``gemma4_ple`` (per-layer inputs, as the E2B / E4B models an assistant ships for).

The assistant reuses the target's keys and values in every layer (the last sliding and the last full
target layer: HF ``shared_kv_states``), so its query widths, KV head count and layer kinds follow the
target's; its input is ``pre_projection(concat(target embedding of the token, target hidden state))``
with ``backbone_hidden_size`` = the target's width, and it shares the target's vocabulary.

HF's drafts are computed as ``transformers.generation.candidate_generator.SinglePositionMultiTokenCandidateGenerator``
does right after the target's prefill: the target runs the prefix ``ids[:T]`` (``output_hidden_states``,
``return_shared_kv_states``), picks its greedy token ``x_T``; the assistant is then called ``k`` times at
position ``T`` with ``inputs_embeds = concat(embed_tokens(x), hidden)``: first ``x = x_T`` and the target's
last hidden state (``hidden_states[-1]``: after the final norm), then its own argmax and its projected state.
The GGUF is written by llama.cpp's converter (``Gemma4AssistantModel``) with archrun's tiny tokenizer.
torch and transformers are imported only by the functions that need them.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from archrun.conformance import hf

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
FAMILY_TESTS = HERE.parent
NAME = "gemma4_assistant"
TARGETS = ("gemma4_dense", "gemma4_kv_shared", "gemma4_ple")  # fixtures of ../hf_arch.py (GGUFs in ../goldens)
SEED = 11
#: target prefix lengths the drafts start from (the target fixture's sliding window is 6: both sides of it)
PREFIXES = (1, 5, 6, 7, 13, 24)
N_DRAFT = 4

_S, _F = "sliding_attention", "full_attention"

#: the assistant's text model: the target's head widths, KV heads, window and ropes; a narrower stream
TEXT_CONFIG = {
    "vocab_size": hf.N_VOCAB, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
    "sliding_window": 6, "layer_types": [_S, _S, _F], "num_kv_shared_layers": 3,
    "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
    "max_position_embeddings": 256, "bos_token_id": hf.N_VOCAB - 2, "eos_token_id": hf.N_VOCAB - 1,
    "rope_parameters": {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}
BACKBONE_HIDDEN_SIZE = 64  # the target fixtures' hidden_size


def golden_path(target: str, out_dir: Path = GOLDENS) -> Path:
    """The .npz of HF's drafts on target fixture ``target``."""
    return out_dir / f"{NAME}_on_{target}.npz"


def build_target(target: str):
    """The target's HF model (eval mode), as ``hf.build_tiny`` builds the fixture."""
    spec = hf.load_module(FAMILY_TESTS / "hf_arch.py")
    fixture = next(f for f in spec.FIXTURES if f.name == target)
    model, _ = hf.build_tiny(hf.arch_of(spec.ARCHES, fixture), fixture.seed, **fixture.overrides)
    return model


def build_assistant(seed: int = SEED):
    """The tiny random float32 HF assistant, deterministic from ``seed``: every persistent tensor drawn from
    its own generator seeded by (seed, name) as ``hf.build_tiny`` draws them (matrices N(0, 1/sqrt(fan_in)),
    embeddings N(0, 0.25), norms and layer scalars 1 + 0.3 N(0, 1))."""
    import torch
    import transformers

    text = transformers.Gemma4TextConfig(**TEXT_CONFIG, attn_implementation="eager")
    config = transformers.Gemma4AssistantConfig(text_config=text, backbone_hidden_size=BACKBONE_HIDDEN_SIZE,
                                                use_ordered_embeddings=False, tie_word_embeddings=True)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Gemma4AssistantForCausalLM(config).eval()
    persistent = set(model.state_dict())
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name not in persistent:
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
            if tensor.dim() == 1 or name.endswith("layer_scalar"):
                tensor.copy_(1.0 + 0.3 * noise)
            elif "embed_tokens" in name:
                tensor.copy_(0.25 * noise)
            else:
                tensor.copy_(noise / tensor.shape[-1] ** 0.5)
    return model


def hf_drafts(target, assistant, ids: np.ndarray, n_prefix: int, n_draft: int = N_DRAFT):
    """HF's drafting round after the target's prefill of ``ids[:n_prefix]`` (module docstring).

    Returns (x_T, the target's hidden state [d] at T-1, logits [n_draft, vocab], tokens [n_draft]).
    """
    import torch

    with torch.no_grad():
        prefix = torch.from_numpy(np.asarray(ids[:n_prefix], np.int64))[None]
        out = target(prefix, output_hidden_states=True, return_shared_kv_states=True, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)                          # x_T, the target's greedy token
        hidden = out.hidden_states[-1][:, -1:]
        shared = dict(out.shared_kv_states)
        position = torch.tensor([[n_prefix]])
        mask = torch.ones(1, n_prefix + 1, dtype=torch.long)           # generate's mask over input_ids
        embed = target.get_input_embeddings()
        state, logits, tokens = hidden, [], []
        for _ in range(n_draft):
            step = assistant(inputs_embeds=torch.cat([embed(token), state], dim=-1), attention_mask=mask,
                             position_ids=position, shared_kv_states=shared, use_cache=False)
            token, state = step.logits.argmax(-1), step.last_hidden_state
            logits.append(step.logits[0, 0].float().numpy())
            tokens.append(int(token))
    x_t = int(out.logits[0, -1].argmax())
    return x_t, hidden[0, 0].float().numpy(), np.stack(logits), np.asarray(tokens, np.int32)


def record(out_dir: Path = GOLDENS) -> list[Path]:
    """Write ``<NAME>.gguf`` (llama.cpp's converter) and, per target, ``golden_path(target)`` (HF's drafts)
    into ``out_dir``; return the written paths."""
    import torch

    from archrun.conformance import llamacpp
    from archrun.conformance.hf.convert import config_json

    torch.set_num_threads(2)
    out_dir.mkdir(parents=True, exist_ok=True)
    assistant = build_assistant()
    cfg = config_json(assistant.config)
    tokens, merges, types = hf.vocabulary(hf.N_VOCAB)
    vocab = {"tokens": tokens, "merges": merges, "types": types, "pre": "qwen2",
             "bos": hf.N_VOCAB - 2, "eos": hf.N_VOCAB - 1}
    gguf_path = llamacpp.convert(assistant, out_dir / f"{NAME}.gguf", vocab, name=f"tiny-{NAME}")
    written = [gguf_path]
    for name in TARGETS:
        target = build_target(name)
        target_golden = hf.load_golden(FAMILY_TESTS / "goldens" / f"{name}.npz")
        ids = target_golden["ids"]
        logits, _ = hf.hf_logits(target, ids)
        err = float(np.abs(logits - target_golden["logits"]).max())
        if err > 1e-4:  # the kit's bound for a rebuilt fixture (record_chains)
            raise SystemExit(f"the rebuilt {name} is {err:.2e} off its recorded logits: not recording")
        rounds = [hf_drafts(target, assistant, ids, t) for t in PREFIXES]
        meta = {"name": NAME, "seed": SEED, "target": name,
                "target_gguf_sha256": target_golden["fixture"]["gguf_sha256"], "gguf": gguf_path.name,
                "gguf_sha256": hf._sha256(gguf_path), "prefixes": list(PREFIXES), "n_draft": N_DRAFT}
        out = golden_path(name, out_dir)
        np.savez_compressed(
            out, ids=ids, prefixes=np.asarray(PREFIXES, np.int32),
            first_tokens=np.asarray([r[0] for r in rounds], np.int32),
            hidden=np.stack([r[1] for r in rounds]), draft_logits=np.stack([r[2] for r in rounds]),
            draft_tokens=np.stack([r[3] for r in rounds]), config_json=np.array(cfg),
            fixture_json=np.array(json.dumps(meta, sort_keys=True)),
            versions_json=np.array(json.dumps(hf.versions(), sort_keys=True)))
        written.append(out)
    return written
