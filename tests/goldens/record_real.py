"""Record reference goldens for the three real GGUF models from HF transformers and llama.cpp.

Nothing here imports archrun: every number comes from an independent reference.

Usage (see tests/goldens/README.md for the full order):
    .venv/bin/python     tests/goldens/record_real.py --ref hf --model smollm2 --chat-only
    /work/refvenv/bin/python tests/goldens/record_real.py --ref llamacpp --model smollm2
    .venv/bin/python     tests/goldens/record_real.py --ref hf --model smollm2

The llama.cpp run fixes the token ids (``<model>_prompts.json``), the HF run reuses them, so both
references evaluate identical ids. Chat prompts are rendered by HF ``apply_chat_template`` first
(``<model>_chat.json``) and tokenized by llama.cpp.

Outputs in tests/goldens/real/:
    <model>_prompts.json    prompt texts + token ids, chat prompt ids, the 1024 sampled vocab columns
    <model>_<ref>.npz       per-position top-64 / column logits / max / min / margin, greedy chains
    <model>_<ref>.json      versions, date, exact settings
    <model>_tokenize.json   llama.cpp tokenization goldens (llamacpp run)
    <model>_chat.json       HF chat-template renderings (hf run, smollm2 and qwen25)
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

MODEL_DIR = Path(os.environ.get("ARCHRUN_MODEL_DIR", Path.home() / ".cache" / "archrun" / "models"))
OUT_DIR = Path(__file__).resolve().parent / "real"

# name -> GGUF file name in MODEL_DIR
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
HF_CHAT_MODELS = ("smollm2", "qwen25")  # the Gemma GGUF carries no chat template

TOP_K = 64
N_COLS = 1024
N_GREEDY = 16
N_CHAT_GREEDY = 24
N_CHAT_PROMPTS = 3
MIN_PROMPT_TOKENS = 32
MIN_LONG_TOKENS = 600  # longer than Gemma 3's 512-token sliding window
TORCH_THREADS = 2
LLAMA_SETTINGS = {"logits_all": True, "n_ctx": 2048, "n_threads": 2, "seed": 0, "verbose": False}

PROMPTS = {
    "code": (
        "def fibonacci(n):\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b\n"
        "    return a\n\n"
        "print(fibonacci("
    ),
    "prose": (
        "The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small "
        "lantern and a notebook in which he recorded the weather. One stormy night in November, he "
        "noticed"
    ),
    "multilingual": (
        "Français : Bonjour, comment allez-vous ?\n"
        "Deutsch: Wie geht es?\n"
        "Русский: Доброе утро, как дела?\n"
        "中文：早上好，你好吗？\n"
        "日本語："
    ),
}

# Gemma only: a fact stated at the start is asked for at the end, > 512 tokens later, so the
# global (non-sliding) layers must carry it.
LONG_PROMPT = (
    "Notes from the harbour archive. The secret password chosen by the harbour council in 1887 was "
    "\"blue heron\", and it was written on the first page of the ledger.\n\n"
    + "\n\n".join(
        [
            "In the spring of that year the fishing fleet returned early because the ice had melted "
            "weeks ahead of the usual schedule. The merchants who bought cod and herring at the quay "
            "complained that prices had fallen, while the net makers worked late into the night to "
            "repair the damage done by the winter storms.",
            "The harbour master, a careful man named Tobias Lund, kept a daily record of every vessel "
            "that entered or left the port. His entries list the name of the ship, the captain, the "
            "cargo, the tonnage and the direction of the wind. On calm days he added short remarks "
            "about the colour of the sea and the number of gulls following the boats.",
            "During the summer a group of engineers arrived from the capital to survey the old stone "
            "breakwater. They measured the depth of the water at low tide, took samples of the mortar "
            "and drew careful plans of a new pier that would allow steamships to dock even in rough "
            "weather. The townspeople argued for months about who should pay for the work.",
            "def tally(entries):\n    totals = {}\n    for ship, cargo, tons in entries:\n"
            "        totals[cargo] = totals.get(cargo, 0) + tons\n    return totals\n",
            "By autumn the new pier was half finished. Workers hauled granite blocks from a quarry in "
            "the hills, loading them onto flat carts pulled by horses. A small school opened next to "
            "the customs house, where the children of sailors learned to read, to write and to "
            "calculate the price of salt, rope, timber and tar.",
            "Winter came hard. The bay froze from the inner basin to the lighthouse, and for six weeks "
            "no ship could leave. Families burned driftwood to keep warm, and the bakers rationed "
            "flour. The council met every Sunday in the church hall to decide how the remaining stores "
            "should be shared among the households of the town.",
            "When the ice finally broke in March, the first ship to arrive was a schooner from the "
            "south carrying oranges, coffee and letters. Children ran along the quay shouting the news, "
            "and the harbour master wrote the longest entry of his whole career, filling three pages "
            "with the names of everyone who came to greet the crew.",
            "Many years later, a historian studying these records found that the ledgers had been "
            "kept with remarkable care. Every page was numbered, every correction initialled, and "
            "every sum checked twice. Only the very first page carried anything unusual: a single "
            "phrase that the council had agreed to keep secret.",
            "The historian copied the ledgers by hand, page after page, during a long and rainy winter. "
            "She noted the names of the ships and the small drawings of boats in the margins.",
        ]
    )
    + "\n\nQuestion: What was the secret password chosen by the harbour council in 1887?\nAnswer: The "
    "secret password was \""
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant that answers in one sentence."},
        {"role": "user", "content": "Explain what a hash table is."},
    ],
    [
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Write a Python function that reverses a string."},
        {"role": "assistant", "content": "def reverse(s):\n    return s[::-1]"},
        {"role": "user", "content": "Now make it return an empty string when s is None."},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me one fun fact about octopuses."},
    ],
]
GEMMA_CHAT_USER = "What is the capital of France? Answer in one sentence."
GEMMA_CHAT_TEXT = "<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n"

TOKENIZE_CORPUS = [
    "",
    " ",
    "a",
    "Hello, world!",
    "Hello world",
    " Hello world",
    "  leading two spaces",
    "trailing spaces   ",
    "tabs\tbetween\t\twords",
    "line one\nline two\n\nline four\r\nwindows line",
    "\n\n\n",
    "          ten spaces then text",
    "mixed \t \n whitespace \u00a0 nbsp",
    "def add(a, b):\n    return a + b\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}`); };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"box\"><p>Hello &amp; welcome</p></div>",
    "The quick brown fox jumps over the lazy dog.",
    "It's a well-known fact that they'll, we've, I'd and don't are contractions.",
    "Die Straße ist über die Brücke gesperrt, größere Fahrzeuge müssen umkehren.",
    "L'élève a reçu un cadeau à Noël : une bûche et des œufs en chocolat.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "我们今天去公园散步，天气非常好。",
    "東京は日本の首都です。ひらがなとカタカナと漢字。",
    "안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Emoji: 😀 🚀 👍🏽 ❤️",
    "Family ZWJ: 👨‍👩‍👧‍👦 and 🏳️‍🌈 and 👩🏻‍💻",
    "Flags: 🇩🇪 🇫🇷 🇯🇵 🇺🇸",
    "0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "Pneumonoultramicroscopicsilicovolcanoconiosis and Donaudampfschifffahrtsgesellschaftskapitän",
    "https://example.com/path/to/page?query=1&lang=en#section-2",
    "user.name+tag@example.co.uk",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a literal bos<eos>",
    "<|endoftext|><|fim_prefix|>def<|fim_suffix|>",
    "<s> </s> <unk> [INST] [/INST]",
    "<|im_start|",
    "   <|im_start|>   spaced special   ",
    "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ and ½ ① ﬁ ligature",
    "naïve café résumé — “quotes” ‘single’ … ellipsis",
    "\u200bzero\u200bwidth\u200bspace and e\u0301 combining accent",
    "!!!???...,,,;;;:::---___***",
    "$$$ 100€ £20 ¥300 ₹45",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]


# ---------------------------------------------------------------------------- shared helpers


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def now_utc() -> str:
    """Current UTC time, ISO 8601, seconds precision."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def read_json(path: Path) -> dict:
    """Load a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, obj: dict) -> None:
    """Write JSON with a stable, human-diffable layout."""
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def vocab_columns(n_vocab: int) -> np.ndarray:
    """The fixed 1024 vocabulary columns recorded at every position, sorted: (N_COLS,) int32."""
    rng = np.random.default_rng(0)
    return np.sort(rng.choice(n_vocab, size=N_COLS, replace=False)).astype(np.int32)


def top2_margin(row: np.ndarray) -> float:
    """Top-1 minus top-2 logit of one (V,) row."""
    two = np.partition(row, -2)[-2:]
    return float(two[1] - two[0])


def position_stats(logits: np.ndarray, cols: np.ndarray) -> dict[str, np.ndarray]:
    """Per-position summaries of (T, V) float32 logits.

    top_ids/top_logits are (T, TOP_K), ordered by logit descending (ties: lower id first);
    cols_logits is (T, N_COLS); max/min/margin are (T,).
    """
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    part = np.argpartition(-logits, TOP_K, axis=1)[:, : TOP_K + 1]  # (T, K+1) candidates
    top_ids = np.empty((logits.shape[0], TOP_K), dtype=np.int32)
    for t, cand in enumerate(part):
        order = np.lexsort((cand, -logits[t, cand]))  # by logit desc, then id asc
        top_ids[t] = cand[order[:TOP_K]]
    top_logits = np.take_along_axis(logits, top_ids.astype(np.int64), axis=1)
    return {
        "top_ids": top_ids,
        "top_logits": top_logits.astype(np.float32),
        "cols_logits": logits[:, cols].astype(np.float32),
        "max": logits.max(axis=1).astype(np.float32),
        "min": logits.min(axis=1).astype(np.float32),
        "margin": (top_logits[:, 0] - top_logits[:, 1]).astype(np.float32),
    }


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Compressed npz with keys like 'code.top_ids'."""
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def greedy_arrays(prefix: str, ids: list[int], margins: list[float]) -> dict[str, np.ndarray]:
    """npz entries for one greedy chain."""
    return {
        f"{prefix}.greedy_ids": np.asarray(ids, dtype=np.int32),
        f"{prefix}.greedy_margin": np.asarray(margins, dtype=np.float32),
    }


def gguf_path(model: str) -> Path:
    """Absolute path of the model's GGUF file."""
    path = MODEL_DIR / MODELS[model]
    if not path.exists():
        sys.exit(f"missing {path}: run scripts/fetch_models.py {model}")
    return path


# ---------------------------------------------------------------------------- llama.cpp


def new_llama(path: Path):
    """A fresh llama.cpp context with the fixed recording settings."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), **LLAMA_SETTINGS)


def detok(llm, ids: list[int], unparse_special: bool) -> dict:
    """llama.cpp's own llama_detokenize (remove_special=False) of an id list.

    Returns {"text": str} for valid UTF-8, else {"text": None, "hex": ...}.
    """
    import ctypes

    import llama_cpp

    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    vocab = llm._model.vocab
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    if n < 0:
        raise RuntimeError(f"llama_detokenize needs {-n} bytes")
    raw = buf.raw[:n]
    try:
        return {"text": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"text": None, "hex": raw.hex()}


def tokenizer_meta(llm) -> dict:
    """add_bos/add_eos and special ids as llama.cpp reports them, plus raw GGUF tokenizer flags."""
    meta = {k: v for k, v in llm.metadata.items() if k.startswith("tokenizer.") and "chat_template" not in k}
    return {
        "add_bos": bool(llm._model.add_bos_token()),
        "add_eos": bool(llm._model.add_eos_token()),
        "bos_id": int(llm.token_bos()),
        "eos_id": int(llm.token_eos()),
        "n_vocab": int(llm.n_vocab()),
        "gguf_tokenizer_metadata": meta,
    }


def record_tokenize(model: str, llm) -> None:
    """Write <model>_tokenize.json: three tokenizations and their detokenizations per string."""
    cases = []
    for text in TOKENIZE_CORPUS:
        raw = text.encode("utf-8")
        case = {"text": text}
        for key, bos, special in (("bos", True, False), ("plain", False, False), ("special", False, True)):
            ids = llm.tokenize(raw, add_bos=bos, special=special)
            case[key] = ids
            case[f"{key}_detok"] = detok(llm, ids, unparse_special=False)
            case[f"{key}_detok_special"] = detok(llm, ids, unparse_special=True)
        cases.append(case)
    obj = {
        "model": model,
        "gguf": MODELS[model],
        "calls": {
            "bos": "Llama.tokenize(text.encode(), add_bos=True, special=False)",
            "plain": "Llama.tokenize(text.encode(), add_bos=False, special=False)",
            "special": "Llama.tokenize(text.encode(), add_bos=False, special=True)",
            "*_detok": "llama_detokenize(ids, remove_special=False, unparse_special=False)",
            "*_detok_special": "llama_detokenize(ids, remove_special=False, unparse_special=True)",
        },
        **tokenizer_meta(llm),
        "versions": versions(),
        "cases": cases,
    }
    write_json(OUT_DIR / f"{model}_tokenize.json", obj)


def chat_prompt_texts(model: str) -> list[dict]:
    """Chat prompt texts to tokenize with special=True: HF renderings or the fixed Gemma turn."""
    if model == "gemma3":
        text = GEMMA_CHAT_TEXT.format(content=GEMMA_CHAT_USER)
        return [{"conversation": [{"role": "user", "content": GEMMA_CHAT_USER}], "text": text}]
    chat_file = OUT_DIR / f"{model}_chat.json"
    if not chat_file.exists():
        sys.exit(f"missing {chat_file}: first run --ref hf --model {model} --chat-only")
    rendered = read_json(chat_file)["conversations"][:N_CHAT_PROMPTS]
    return [{"conversation": c["messages"], "text": c["rendered"]} for c in rendered]


def build_prompts(model: str, llm) -> dict:
    """Token ids of every prompt (llama.cpp tokenizer, add_bos per metadata) and the vocab columns."""
    add_bos = bool(llm._model.add_bos_token())
    texts = dict(PROMPTS, **({"long": LONG_PROMPT} if model == "gemma3" else {}))
    prompts = {}
    for name, text in texts.items():
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)
        need = MIN_LONG_TOKENS if name == "long" else MIN_PROMPT_TOKENS
        if len(ids) < need:
            raise SystemExit(f"{model}/{name}: {len(ids)} tokens < {need}")
        prompts[name] = {"text": text, "n_tokens": len(ids), "ids": ids}
    chats = []
    for chat in chat_prompt_texts(model):
        ids = llm.tokenize(chat["text"].encode("utf-8"), add_bos=add_bos, special=True)
        chats.append({**chat, "n_tokens": len(ids), "ids": ids})
    return {
        "model": model,
        "gguf": MODELS[model],
        "gguf_sha256": sha256(gguf_path(model)),
        "add_bos": add_bos,
        "tokenize_call": f"Llama.tokenize(text.encode(), add_bos={add_bos}, special=False)",
        "chat_tokenize_call": f"Llama.tokenize(text.encode(), add_bos={add_bos}, special=True)",
        "n_vocab": int(llm.n_vocab()),
        "cols": vocab_columns(int(llm.n_vocab())).tolist(),
        "prompts": prompts,
        "chat_prompts": chats,
    }


def load_or_build_prompts(model: str, llm) -> dict:
    """Reuse <model>_prompts.json when its ids still match llama.cpp's tokenizer, else (re)write it."""
    path = OUT_DIR / f"{model}_prompts.json"
    fresh = build_prompts(model, llm)
    if path.exists():
        old = read_json(path)
        same = old.get("prompts") == fresh["prompts"] and old.get("chat_prompts") == fresh["chat_prompts"]
        if same:
            return old
        print(f"note: {path.name} differs from the current tokenization; rewriting it")
    write_json(path, fresh)
    return fresh


def llama_run(llm, ids: list[int], n_new: int) -> tuple[np.ndarray, list[int], list[float]]:
    """Evaluate ids, then greedy-extend n_new tokens one eval at a time.

    Returns the prompt's (T, V) logits, the greedy ids and each step's top-1/top-2 margin.
    """
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    out, margins = [], []
    for step in range(n_new):
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        nxt = int(np.argmax(row))
        out.append(nxt)
        margins.append(top2_margin(row))
        if step + 1 < n_new:
            llm.eval([nxt])
    return logits, out, margins


def record_llamacpp(model: str) -> None:
    """Tokenization goldens, prompt ids, per-position logits and greedy chains from llama.cpp."""
    path = gguf_path(model)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    llm = new_llama(path)
    record_tokenize(model, llm)
    spec = load_or_build_prompts(model, llm)
    cols = np.asarray(spec["cols"], dtype=np.int32)
    arrays: dict[str, np.ndarray] = {"cols": cols}
    for name, prompt in spec["prompts"].items():
        llm = new_llama(path)  # fresh context per prompt: no state carried between prompts
        logits, greedy, margins = llama_run(llm, prompt["ids"], N_GREEDY)
        arrays.update({f"{name}.{k}": v for k, v in position_stats(logits, cols).items()})
        arrays.update(greedy_arrays(name, greedy, margins))
        print(f"{model}/{name}: {len(prompt['ids'])} tokens, greedy {greedy}")
    for i, chat in enumerate(spec["chat_prompts"]):
        llm = new_llama(path)
        _, greedy, margins = llama_run(llm, chat["ids"], N_CHAT_GREEDY)
        arrays.update(greedy_arrays(f"chat{i}", greedy, margins))
        print(f"{model}/chat{i}: greedy {llm.detokenize(greedy)!r}")
    save_npz(OUT_DIR / f"{model}_llamacpp.npz", arrays)
    settings = {
        **LLAMA_SETTINGS,
        "n_batch": llm.n_batch,
        "n_ubatch": llm.context_params.n_ubatch,
        "swa_full": bool(llm.context_params.swa_full),
        "type_k": int(llm.context_params.type_k),
        "flash_attn": str(getattr(llm.context_params, "flash_attn_type", "n/a")),
        "context": "a fresh Llama(...) per prompt; eval(ids), then eval([argmax]) per greedy step",
    }
    write_run_meta(model, "llamacpp", settings, {"system_info": llama_system_info()})


def llama_system_info() -> str:
    """llama.cpp's compile/CPU feature line."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


# ---------------------------------------------------------------------------- HF transformers


def hf_tokenizer(model: str):
    """The tokenizer transformers builds from the GGUF (vocab, merges and chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR), gguf_file=MODELS[model])


def record_chat_templates(model: str) -> None:
    """Write <model>_chat.json: apply_chat_template(..., tokenize=False, add_generation_prompt=True)."""
    tok = hf_tokenizer(model)
    convs = [
        {
            "messages": msgs,
            "rendered": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
        }
        for msgs in CONVERSATIONS
    ]
    obj = {
        "model": model,
        "gguf": MODELS[model],
        "call": "AutoTokenizer.from_pretrained(dir, gguf_file=name).apply_chat_template("
        "messages, tokenize=False, add_generation_prompt=True)",
        "chat_template": tok.chat_template,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "versions": versions(),
        "date": now_utc(),
        "conversations": convs,
    }
    write_json(OUT_DIR / f"{model}_chat.json", obj)


def hf_model(model: str):
    """float32 model dequantized from the GGUF by transformers, eager attention, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(TORCH_THREADS)
    m = AutoModelForCausalLM.from_pretrained(
        str(MODEL_DIR), gguf_file=MODELS[model], torch_dtype=torch.float32, attn_implementation="eager"
    )
    return m.eval()


def hf_logits(m, ids: list[int]):
    """Full forward of one sequence: (T, V) float32 torch logits."""
    import torch

    with torch.no_grad():
        return m(torch.tensor([ids]), use_cache=False).logits[0].float()


def hf_greedy(m, ids: list[int], n_new: int) -> tuple[list[int], list[float], float]:
    """Greedy n_new tokens with the KV cache, then re-checked by one full forward.

    Returns the ids, the per-step top-1/top-2 margins, and the largest |cached - full| logit
    difference over the greedy steps (the chain is rejected if the full forward disagrees).
    """
    import torch

    out, margins, rows = [], [], []
    with torch.no_grad():
        res = m(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        for step in range(n_new):
            row = res.logits[0, -1].float()
            rows.append(row)
            nxt = int(torch.argmax(row))
            out.append(nxt)
            margins.append(top2_margin(row.numpy()))
            if step + 1 < n_new:
                res = m(torch.tensor([[nxt]]), past_key_values=res.past_key_values, use_cache=True)
        full = m(torch.tensor([ids + out[:-1]]), use_cache=False, logits_to_keep=n_new).logits[0].float()
    cached = torch.stack(rows)
    if not torch.equal(full.argmax(dim=-1), torch.tensor(out)):
        raise SystemExit("HF greedy with KV cache disagrees with the full forward")
    return out, margins, float((cached - full).abs().max())


def hf_config_summary(m) -> dict:
    """The config fields that matter for correctness, as transformers parsed them from the GGUF."""
    cfg = m.config.to_dict()
    keys = (
        "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "rms_norm_eps", "rope_theta", "rope_local_base_freq", "rope_parameters", "rope_scaling",
        "sliding_window", "sliding_window_pattern", "layer_types", "query_pre_attn_scalar",
        "final_logit_softcapping", "attn_logit_softcapping", "tie_word_embeddings",
        "hidden_activation", "hidden_act", "max_position_embeddings", "bos_token_id", "eos_token_id",
    )  # fmt: skip
    summary = {k: cfg[k] for k in keys if k in cfg}
    summary["class"] = type(m).__name__
    summary["attn_implementation"] = m.config._attn_implementation
    return summary


def record_hf(model: str) -> None:
    """Per-position logits and greedy chains from HF transformers on the llama.cpp-fixed ids."""
    spec_path = OUT_DIR / f"{model}_prompts.json"
    if not spec_path.exists():
        sys.exit(f"missing {spec_path}: first run --ref llamacpp --model {model}")
    spec = read_json(spec_path)
    m = hf_model(model)
    if m.config.vocab_size < spec["n_vocab"]:
        raise SystemExit(f"HF vocab {m.config.vocab_size} < llama.cpp vocab {spec['n_vocab']}")
    cols = np.asarray(spec["cols"], dtype=np.int32)
    arrays: dict[str, np.ndarray] = {"cols": cols}
    checks = {}
    for name, prompt in spec["prompts"].items():
        logits = hf_logits(m, prompt["ids"]).numpy()[:, : spec["n_vocab"]]
        arrays.update({f"{name}.{k}": v for k, v in position_stats(logits, cols).items()})
        greedy, margins, diff = hf_greedy(m, prompt["ids"], N_GREEDY)
        arrays.update(greedy_arrays(name, greedy, margins))
        checks[name] = diff
        print(f"{model}/{name}: {len(prompt['ids'])} tokens, greedy {greedy}")
    for i, chat in enumerate(spec["chat_prompts"]):
        greedy, margins, diff = hf_greedy(m, chat["ids"], N_CHAT_GREEDY)
        arrays.update(greedy_arrays(f"chat{i}", greedy, margins))
        checks[f"chat{i}"] = diff
        print(f"{model}/chat{i}: greedy {greedy}")
    save_npz(OUT_DIR / f"{model}_hf.npz", arrays)
    settings = {
        "load": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, torch_dtype=torch.float32, "
        "attn_implementation='eager').eval()",
        "torch_threads": TORCH_THREADS,
        "no_grad": True,
        "prompt_logits": "one full forward per prompt, use_cache=False",
        "greedy": "KV cache (DynamicCache), argmax per step; verified by one full forward over "
        "prompt + greedy[:-1]",
    }
    extra = {"config": hf_config_summary(m), "greedy_cache_vs_full_max_abs_diff": checks}
    write_run_meta(model, "hf", settings, extra)


# ---------------------------------------------------------------------------- HF vs llama.cpp


def first_divergence(a: np.ndarray, b: np.ndarray) -> int | None:
    """Index of the first differing id of two greedy chains, None when equal."""
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else None


def compare(model: str) -> dict:
    """HF vs llama.cpp agreement over every position of every prompt (reads the two npz files).

    max_abs_diff is over the 1024 recorded columns and the per-position max logit; argmax
    disagreement and the largest HF top-1/top-2 margin at which the argmaxes still differ.
    """
    hf = np.load(OUT_DIR / f"{model}_hf.npz")
    lc = np.load(OUT_DIR / f"{model}_llamacpp.npz")
    prompts = sorted({k.split(".")[0] for k in hf.files if k.endswith(".top_ids")})
    diffs, differ, margins, greedy = [], [], [], {}
    for p in prompts:
        diffs.append(np.abs(hf[f"{p}.cols_logits"] - lc[f"{p}.cols_logits"]).max())
        diffs.append(np.abs(hf[f"{p}.max"] - lc[f"{p}.max"]).max())
        mask = hf[f"{p}.top_ids"][:, 0] != lc[f"{p}.top_ids"][:, 0]
        differ.append(mask)
        margins.extend(hf[f"{p}.margin"][mask].tolist())
    for k in sorted(f for f in hf.files if f.endswith(".greedy_ids")):
        greedy[k.split(".")[0]] = first_divergence(hf[k], lc[k])
    differ_all = np.concatenate(differ)
    return {
        "positions": int(differ_all.size),
        "max_abs_diff": float(max(diffs)),
        "argmax_differ_fraction": float(differ_all.mean()),
        "argmax_differ_count": int(differ_all.sum()),
        "max_hf_margin_where_differ": float(max(margins)) if margins else None,
        "greedy_first_divergence": greedy,
    }


# ---------------------------------------------------------------------------- metadata + CLI


def versions() -> dict:
    """Versions of every package that can influence the recorded numbers."""
    from importlib import metadata

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("numpy", "torch", "transformers", "tokenizers", "gguf", "llama_cpp_python", "jinja2"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def write_run_meta(model: str, ref: str, settings: dict, extra: dict) -> None:
    """Write <model>_<ref>.json next to the npz."""
    obj = {
        "model": model,
        "ref": ref,
        "gguf": MODELS[model],
        "gguf_sha256": sha256(gguf_path(model)),
        "date": now_utc(),
        "command": f"python tests/goldens/record_real.py --ref {ref} --model {model}",
        "versions": versions(),
        "settings": settings,
        "constants": {"top_k": TOP_K, "n_cols": N_COLS, "cols_rng": "np.random.default_rng(0)",
                      "n_greedy": N_GREEDY, "n_chat_greedy": N_CHAT_GREEDY},
        **extra,
    }
    write_json(OUT_DIR / f"{model}_{ref}.json", obj)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", choices=("hf", "llamacpp"))
    ap.add_argument("--model", choices=tuple(MODELS), required=True)
    ap.add_argument("--chat-only", action="store_true", help="hf: only render <model>_chat.json")
    ap.add_argument("--compare", action="store_true", help="print HF vs llama.cpp agreement, record nothing")
    args = ap.parse_args(argv)
    if args.compare:
        print(json.dumps(compare(args.model), indent=1))
        return
    if args.ref is None:
        ap.error("--ref is required unless --compare is given")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if args.ref == "llamacpp":
        record_llamacpp(args.model)
        return
    chat_missing = not (OUT_DIR / f"{args.model}_chat.json").exists()
    if args.model in HF_CHAT_MODELS and (args.chat_only or chat_missing):
        record_chat_templates(args.model)
    if not args.chat_only:
        record_hf(args.model)


if __name__ == "__main__":
    main()
