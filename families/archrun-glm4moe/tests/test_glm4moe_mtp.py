"""glm4moe MTP (nextn) head: HF goldens, hand numpy math, the host_step seam, greedy verification.

Goldens: goldens/glm4moe_*.npz `mtp_logits` (recorded by goldens/record.py
from HF transformers' MtpModel): row j = MTP fed hidden[j] (after output_norm) and ids[j+1] at
position j+1, attending to rows 0..j; it predicts ids[j+2].
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.errors import InvalidRequest, MissingTensor, WrongBlockStyle
from archrun_glm4moe.mtp import MtpHead, verify

TINY = Path(__file__).resolve().parent / "goldens"
MTP_FIXTURES = ("glm4moe_base", "glm4moe_qknorm_groups_tied", "glm4moe_prf025_nonorm_tied")


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to max |ref|."""
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def golden(name: str) -> dict[str, np.ndarray]:
    z = np.load(TINY / f"{name}.npz")
    return {"ids": z["ids"].astype(np.int64), "logits": z["logits"], "mtp": z["mtp_logits"]}


@pytest.fixture(scope="module", params=MTP_FIXTURES)
def loaded(request):
    model = archrun.load(TINY / f"{request.param}.gguf")
    return request.param, model, MtpHead(model)


def drafts_stepwise(model, head, ids: np.ndarray, chunks: list[int]) -> dict[int, np.ndarray]:
    """Feed ids in chunks through host_step with the MTP seam; after a chunk ending at position j,
    draft with ids[j+1]. Returns {j: draft logits} (comparable to golden row j)."""
    cache, mtp = model.init_cache(len(ids)), head.init_cache(len(ids))
    out, pos = {}, 0
    for n in chunks:
        model.host_step(ids[pos : pos + n], cache, mtp)
        pos += n
        assert len(mtp) == pos == len(cache) and len(mtp.kv) == pos - 1
        if pos < len(ids):
            out[pos - 1] = head.draft(mtp, int(ids[pos]))
            assert len(mtp.kv) == pos - 1  # the draft row is scratch, not committed
    return out


# -- HF goldens ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_drafts_match_hf_token_by_token(name, backend):
    g = golden(name)
    model = archrun.load(TINY / f"{name}.gguf", backend=backend)
    got = drafts_stepwise(model, MtpHead(model), g["ids"], [1] * len(g["ids"]))
    assert sorted(got) == list(range(len(g["ids"]) - 1))
    assert rel_err(np.stack([got[j] for j in sorted(got)]), g["mtp"]) <= 1e-4


def test_drafts_match_hf_with_chunked_trunk_steps(loaded):
    name, model, head = loaded
    g = golden(name)
    got = drafts_stepwise(model, head, g["ids"], [6, 1, 4, 1, 1, 9, 3, 2, 13])
    for j, logits in got.items():
        assert rel_err(logits, g["mtp"][j]) <= 1e-4, j


def test_optional_nextn_copies_fall_back_to_the_trunk(tmp_path):
    # nextn.embed_tokens / nextn.shared_head_head are copies of token_embd / output in these files
    for name in ("glm4moe_base", "glm4moe_prf025_nonorm_tied"):
        path = copy_without(TINY / f"{name}.gguf", tmp_path / f"{name}.gguf",
                            ("nextn.embed_tokens", "nextn.shared_head_head"))
        model = archrun.load(path)
        head = MtpHead(model)
        assert head.embed_tokens is None and head.head_matrix is None
        g = golden(name)
        got = drafts_stepwise(model, head, g["ids"], [5, 1, 1, 20])
        assert all(rel_err(v, g["mtp"][j]) <= 1e-4 for j, v in got.items())


# -- hand numpy (the formula in archrun_glm4moe.mtp's docstring, weights read by gguf-py) -------


class Hand:
    """glm4moe trunk + MTP block in plain float64 numpy from gguf-py's reader."""

    def __init__(self, path: Path):
        r = gguf.GGUFReader(str(path))
        self.m = {k.removeprefix("glm4moe."): f.contents() for k, f in r.fields.items()}
        self.w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
        self.n_trunk = self.m["block_count"] - self.m["nextn_predict_layers"]
        self.n_head, self.n_kv = self.m["attention.head_count"], self.m["attention.head_count_kv"]
        self.hd = self.m.get("attention.key_length", self.m["embedding_length"] // self.n_head)

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.m["attention.layer_norm_rms_epsilon"]) * w

    def rope(self, x, pos):  # NEOX on the first n_rot dims of each head; x [n, H, hd]
        r = self.m["rope.dimension_count"]
        ang = pos[:, None, None] * self.m["rope.freq_base"] ** (-np.arange(r // 2) * 2.0 / r)
        c, s, a, b = np.cos(ang), np.sin(ang), x[..., : r // 2], x[..., r // 2 : r]
        return np.concatenate([a * c - b * s, b * c + a * s, x[..., r:]], axis=-1)

    def attention(self, x, i, pos):
        w, n = self.w, len(x)

        def proj(t, heads):
            y = x @ w[f"blk.{i}.attn_{t}.weight"].T + w.get(f"blk.{i}.attn_{t}.bias", 0.0)
            y = y.reshape(n, heads, self.hd)
            qk_norm = w.get(f"blk.{i}.attn_{t}_norm.weight")
            return y if qk_norm is None else self.rms(y, qk_norm)

        q, k, v = proj("q", self.n_head), proj("k", self.n_kv), proj("v", self.n_kv)
        q, k = self.rope(q, pos), self.rope(k, pos)
        k, v = (np.repeat(t, self.n_head // self.n_kv, axis=1) for t in (k, v))  # GQA
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.hd) + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v).reshape(n, -1)
        return o @ w[f"blk.{i}.attn_output.weight"].T

    def ffn(self, x, i):
        w, m, b = self.w, self.m, f"blk.{i}."

        def swiglu(x, g, u, d):
            gx = x @ g.T
            return (gx / (1 + np.exp(-gx)) * (x @ u.T)) @ d.T

        if b + "ffn_gate.weight" in w:  # leading dense layer
            return swiglu(x, *(w[b + f"ffn_{t}.weight"] for t in ("gate", "up", "down")))
        probs = 1 / (1 + np.exp(-(x @ w[b + "ffn_gate_inp.weight"].T)))  # sigmoid router [n, E]
        sel = probs + w[b + "exp_probs_b.bias"]  # the bias steers the choice only
        groups = sel.reshape(len(x), m["expert_group_count"], -1)
        score = np.sort(groups, -1)[..., -2:].sum(-1)  # group score: sum of its top-2
        drop = np.argsort(score, -1)[:, : m["expert_group_count"] - m["expert_group_used_count"]]
        np.put_along_axis(groups, drop[..., None], -np.inf, axis=1)
        top = np.argsort(-groups.reshape(len(x), -1), -1)[:, : m["expert_used_count"]]
        wts = np.take_along_axis(probs, top, -1)
        if m["expert_weights_norm"]:
            wts = wts / wts.sum(-1, keepdims=True)
        out = swiglu(x, *(w[b + f"ffn_{t}_shexp.weight"] for t in ("gate", "up", "down")))
        for r, e in np.ndindex(top.shape):
            ex = (w[b + f"ffn_{t}_exps.weight"][top[r, e]] for t in ("gate", "up", "down"))
            out[r] += m["expert_weights_scale"] * wts[r, e] * swiglu(x[r : r + 1], *ex)[0]
        return out

    def block(self, x, i, pos):
        x = x + self.attention(self.rms(x, self.w[f"blk.{i}.attn_norm.weight"]), i, pos)
        return x + self.ffn(self.rms(x, self.w[f"blk.{i}.post_attention_norm.weight"]), i)  # pre-FFN norm

    def trunk(self, ids):
        """(logits [n, vocab], hidden after output_norm [n, d])."""
        x, pos = self.w["token_embd.weight"][ids], np.arange(len(ids))
        for i in range(self.n_trunk):
            x = self.block(x, i, pos)
        h = self.rms(x, self.w["output_norm.weight"])
        return h @ self.w.get("output.weight", self.w["token_embd.weight"]).T, h

    def mtp(self, ids, h):
        """MTP logits [n-1, vocab]: row j = (ids[j+1], h[j]) at position j+1."""
        w, b = self.w, f"blk.{self.n_trunk}.nextn."
        e = w.get(b + "embed_tokens.weight", w["token_embd.weight"])[ids[1:]]
        x = np.concatenate([self.rms(e, w[b + "enorm.weight"]), self.rms(h[:-1], w[b + "hnorm.weight"])], -1)
        x = self.block(x @ w[b + "eh_proj.weight"].T, self.n_trunk, np.arange(1, len(ids)))
        return self.rms(x, w[b + "shared_head_norm.weight"]) @ w[b + "shared_head_head.weight"].T


def test_drafts_match_hand_numpy(loaded):
    name, model, head = loaded
    g = golden(name)
    hand = Hand(TINY / f"{name}.gguf")
    logits, hidden = hand.trunk(g["ids"])
    ref = hand.mtp(g["ids"], hidden)
    assert rel_err(logits, g["logits"]) <= 1e-4 and rel_err(ref, g["mtp"]) <= 1e-4  # the hand math is right
    got = drafts_stepwise(model, head, g["ids"], [1] * len(g["ids"]))
    assert rel_err(np.stack([got[j] for j in range(len(ref))]), ref) <= 1e-4


# -- the host_step seam -------------------------------------------------------------------------


def test_seam_leaves_trunk_logits_bitwise_identical(loaded):
    name, model, head = loaded
    ids = golden(name)["ids"]
    with_mtp, plain, mtp = model.init_cache(len(ids)), model.init_cache(len(ids)), head.init_cache(len(ids))
    pos = 0
    for n in (7, 1, 1, 5, 1, 12, 2):
        a = model.host_step(ids[pos : pos + n], with_mtp, mtp)
        pos += n
        head.propose(mtp, int(ids[pos]), 2)  # scratch MTP rows must not touch the trunk either
        b = model.host_step(ids[pos - n : pos], plain)
        assert np.array_equal(a.logits, b.logits) and np.array_equal(a.hidden, b.hidden)


def test_propose_chains_from_draft(loaded):
    name, model, head = loaded
    ids = golden(name)["ids"]
    cache, mtp = model.init_cache(32), head.init_cache(32)
    model.host_step(ids[:10], cache, mtp)
    first = head.draft(mtp, int(ids[10]))
    chain = head.propose_logits(mtp, int(ids[10]), 3)
    assert chain.shape == (3, model.descriptor.n_vocab) and np.array_equal(chain[0], first)
    assert head.propose(mtp, int(ids[10]), 3) == [int(np.argmax(r)) for r in chain]
    assert len(mtp) == 10 and len(mtp.kv) == 9


# -- greedy verification ------------------------------------------------------------------------


def greedy_after(model, prefix: np.ndarray, last: int, n: int) -> tuple[list[int], list[np.ndarray]]:
    """The trunk's own greedy continuation of prefix + [last], one token per step (no MTP)."""
    cache = model.init_cache(len(prefix) + n + 1)
    model.host_step(prefix, cache)
    toks, logits, tok = [], [], last
    for _ in range(n):
        logits.append(model.host_step([tok], cache).logits[-1])
        tok = int(np.argmax(logits[-1]))
        toks.append(tok)
    return toks, logits


@pytest.mark.parametrize("n_good,n_drafts", [(2, 4), (3, 3), (0, 1), (0, 3)])
def test_verify_accepts_the_greedy_prefix_and_rewinds_the_rest(loaded, n_good, n_drafts):
    name, model, head = loaded
    ids, vocab = golden(name)["ids"], model.descriptor.n_vocab
    prefix, last = ids[:12], int(ids[12])
    greedy, ref_logits = greedy_after(model, prefix, last, n_drafts + 1)
    drafts = greedy[:n_good] + [(greedy[n_good] + 1) % vocab] + greedy[n_good + 1 : n_drafts]
    drafts = drafts[:n_drafts]
    cache, mtp = model.init_cache(40), head.init_cache(40)
    model.host_step(prefix, cache, mtp)
    accepted, next_logits = verify(model, cache, mtp, last, drafts)
    assert accepted == greedy[:n_good]
    assert rel_err(next_logits, ref_logits[n_good]) <= 1e-5
    assert len(cache) == len(mtp) == len(prefix) + 1 + n_good and len(mtp.kv) == len(mtp) - 1
    # after the rewind both caches continue exactly like fresh ones fed the accepted sequence
    bonus = greedy[n_good]
    fresh, fresh_mtp = model.init_cache(40), head.init_cache(40)
    model.host_step(np.array([*prefix, last, *accepted]), fresh, fresh_mtp)
    assert rel_err(head.draft(mtp, bonus), head.draft(fresh_mtp, bonus)) <= 1e-5
    a, b = model.host_step([bonus], cache, mtp), model.host_step([bonus], fresh, fresh_mtp)
    assert rel_err(a.logits, b.logits) <= 1e-5


def test_verify_without_mtp_cache(loaded):
    name, model, _ = loaded
    ids = golden(name)["ids"]
    greedy, _ = greedy_after(model, ids[:8], int(ids[8]), 2)
    cache = model.init_cache(20)
    model.host_step(ids[:8], cache)
    wrong = (greedy[1] + 1) % model.descriptor.n_vocab
    accepted, _ = verify(model, cache, None, int(ids[8]), [greedy[0], wrong])
    assert accepted == greedy[:1] and len(cache) == 10


@pytest.mark.parametrize("n_draft", [1, 3])
def test_speculative_loop_reproduces_plain_greedy(loaded, n_draft):
    name, model, head = loaded
    prompt = golden(name)["ids"][:6]
    plain, _ = greedy_after(model, prompt[:-1], int(prompt[-1]), 14)
    cache, mtp = model.init_cache(40), head.init_cache(40)
    tok = int(np.argmax(model.host_step(prompt, cache, mtp).logits[-1]))
    out = [tok]
    while len(out) < len(plain):
        accepted, logits = verify(model, cache, mtp, tok, head.propose(mtp, tok, n_draft))
        tok = int(np.argmax(logits))
        out += [*accepted, tok]
    assert out[: len(plain)] == plain


# -- errors ---------------------------------------------------------------------------------------


def test_model_without_nextn_layers_is_refused():
    model = archrun.load(TINY / "glm4moe_hd24_shared2_nomtp.gguf")
    with pytest.raises(MissingTensor, match="0 MTP"):
        MtpHead(model)


def test_a_fused_model_drafts_on_its_fast_ops():
    """Block style fused: the trunk's hidden states come from forward_step_hidden (one-token steps
    on the fused kernels), the head runs the model's fast ops; drafts still match HF."""
    g = golden("glm4moe_base")
    model = archrun.load(TINY / "glm4moe_base.gguf", block_style="fused")
    head, ids = MtpHead(model), g["ids"]
    cache, mtp = model.init_cache(len(ids)), head.init_cache(len(ids))
    got = []
    for j in range(len(ids) - 1):
        step = model.forward_step_hidden(ids[j:j + 1], cache)
        mtp.advance(ids[j:j + 1], step.hidden)
        got.append(head.draft(mtp, int(ids[j + 1])))
    assert rel_err(np.stack(got), g["mtp"]) <= 1e-4


def test_a_model_without_the_hidden_state_entry_is_refused():
    class NoHidden:  # a Decoder that does not expose its trunk's hidden states
        descriptor = archrun.load(TINY / "glm4moe_base.gguf").descriptor

    with pytest.raises(WrongBlockStyle, match="forward_step_hidden"):
        MtpHead(NoHidden())


def test_bad_requests_are_refused(tmp_path):
    model = archrun.load(TINY / "glm4moe_base.gguf")
    with pytest.raises(MissingTensor, match="block 1"):
        MtpHead(model, k=1)
    with pytest.raises(InvalidRequest):
        MtpHead(model, k=-1)
    head = MtpHead(model)
    cache, mtp = model.init_cache(16), head.init_cache(16, max_rewind=2)
    with pytest.raises(InvalidRequest, match="host_step"):
        head.draft(mtp, 1)
    model.host_step(np.arange(5), cache, mtp)
    for token in (-1, model.descriptor.n_vocab, 1.5, True):
        with pytest.raises(InvalidRequest):
            head.draft(mtp, token)
    with pytest.raises(InvalidRequest, match="max_rewind"):
        mtp.rewind(3)
    with pytest.raises(InvalidRequest):
        head.init_cache(0)
    broken = copy_without(TINY / "glm4moe_base.gguf", tmp_path / "broken.gguf", ("nextn.eh_proj",))
    with pytest.raises(MissingTensor, match="eh_proj"):
        MtpHead(archrun.load(broken))



def copy_without(src: Path, dst: Path, drop: tuple[str, ...]) -> Path:
    """Write dst: src without the tensors whose names contain any of `drop` (metadata copied)."""
    return rewrite_gguf(src, dst, drop_tensors=drop)
