"""The project's replay of vLLM 0.34's GPU `suffix` speculator, in numpy: the same drafts, confidences and corpus as
its Triton kernels (`vllm/v1/worker/gpu/spec_decode/suffix/speculator.py`), about a hundred times faster than
those kernels under Triton's interpreter, and with no vLLM installed.

    python -m spec_plugins.bench.replay --proposers suffix_tree,vllm034_suffix_np --accounting mrv2 --max-draft 8 \
        --workload benchmarks/workloads/code_edits.jsonl

What it reproduces, step by step (the contract test `vllm034_suffix_np` checks each against the kernels, run by
`spec_plugins.bench.vllm034_suffix` in `.venv-vllm034`):

* the request's own history (`_suffix_local_scan_kernel`): the earlier occurrence whose preceding tokens match the
  longest suffix of the context, up to `max_tree_depth`; longer matches win, then later positions; the draft is
  what followed it, cut at the context's end;
* the corpus (`_corpus_draft`, `_suffix_ingest_kernel`): finished responses (with the prompt's last 3 tokens) in a
  ring of `corpus_tokens` separated by -1; two hash tables keyed on the 2 and 4 tokens before each position, 8
  slots a bucket (the newest occurrence in each of the last 8 documents holding the key); a lookup verifies and
  extends each candidate, then votes token by token over the candidates matching at least L tokens and keeps the
  chain with the highest summed vote share (ties: the longer L); the corpus draft wins only on a strictly longer
  match;
* adaptive verification's statistics (`_suffix_observe_kernel`): acceptance per (source, match-length bucket,
  position), halved every 1024 steps, and the per-position confidence (accepted + 1) / (observed + 2) in float32,
  0 on filler slots.

A replay does not say how many slots were verified; `verified` says which rule applies when the statistics are
updated: `all` (Model Runner V2 without adaptive verification: every one of the K slots), or `drafted` (only the
drafted tokens). One `propose` call is one engine step: the statistics' half-life counts calls.
Not reproduced: the index reset after 2**31 documents (unreachable in a replay), documents of one batch that
overwrite each other in the ring (the replay finishes requests one at a time).
"""

from __future__ import annotations

from typing import Any, Hashable, Literal, Sequence

import numpy as np
import pydantic

from spec_plugins.core import Draft, DraftRequest

HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
BUCKET_SLOTS = 8
PROMPT_CONTEXT = 3
NUM_LEN_BUCKETS = 9
STATS_HALF_LIFE = 1024


def len_bucket(match_len: int) -> int:
    """Match lengths 1-6 get their own bucket, then 7-10, 11-20 and 21+ (`_len_bucket`)."""
    return match_len - 1 if match_len <= 6 else 6 if match_len <= 10 else 7 if match_len <= 20 else 8


def _bucket(hv: np.ndarray | np.uint64, num_buckets: int) -> Any:
    return ((hv >> np.uint64(29)) ^ hv) & np.uint64(num_buckets - 1)


def key_buckets(tokens: Sequence[int], num_buckets: int) -> tuple[int, int]:
    """(2-token bucket, 4-token bucket) of the tokens before the end of `tokens`, newest first; missing ones hash
    as 0, as the kernels load them."""
    hv, b2 = np.uint64(0), 0
    with np.errstate(over="ignore"):
        for d in range(4):
            tok = int(tokens[len(tokens) - 1 - d]) if len(tokens) - 1 - d >= 0 else 0
            hv = (hv ^ np.uint64(tok)) * HASH_MUL
            if d == 1:
                b2 = int(_bucket(hv, num_buckets))
    return b2, int(_bucket(hv, num_buckets))


def local_match(seq: np.ndarray, max_depth: int) -> tuple[int, int]:
    """(match_len, end) of the best earlier occurrence of `seq`'s suffix in `seq` itself: longest first, then the
    latest end; (0, 0) when the last token never occurred before."""
    n = len(seq)
    if n < 2:
        return 0, 0
    ends = np.flatnonzero(seq[: n - 1] == seq[n - 1]) + 1
    length = 1
    while ends.size and length < max_depth:
        src = ends - 1 - length
        keep = ends[(src >= 0) & (seq[np.maximum(src, 0)] == seq[n - 1 - length])]
        if not keep.size:
            break
        ends, length = keep, length + 1
    return (length, int(ends[-1])) if ends.size else (0, 0)


class SuffixCorpus:
    """vLLM 0.34's corpus of finished responses and its two hash tables."""

    def __init__(self, capacity: int, max_depth: int) -> None:
        self.capacity, self.max_depth = capacity, max_depth
        self.num_buckets = 1 << (max(16, capacity // 4) - 1).bit_length()  # triton.next_power_of_2
        self.tokens = np.full(max(capacity, 1), -1, dtype=np.int64)
        self.table = np.full((2, self.num_buckets, BUCKET_SLOTS), -1, dtype=np.int64)  # [4-token, 2-token]
        self.head = 0
        self.doc_seq = 0
        self.rejected = 0  # candidates a lookup rejected: hash collisions and overwritten documents

    def ingest(self, doc: np.ndarray) -> None:
        """Append one finished response (already cut to its indexed span) and index each of its positions."""
        cap, n = self.capacity, len(doc)
        head = 0 if self.head + n + 1 > cap else self.head
        self.tokens[head: head + n] = doc
        self.tokens[head + n] = -1
        self.head = head + n + 1
        slot, val = self.doc_seq % BUCKET_SLOTS, (self.doc_seq << 32) + head + np.arange(n, dtype=np.int64)
        self.doc_seq += 1
        hv = np.zeros(n, dtype=np.uint64)
        j = np.arange(n)
        with np.errstate(over="ignore"):
            for d in range(4):
                prev = j - 1 - d
                t = np.where(prev >= 0, doc[np.maximum(prev, 0)], 0).astype(np.uint64)
                hv = (hv ^ t) * HASH_MUL
                if d in (1, 3):
                    table, least = (self.table[1], 2) if d == 1 else (self.table[0], 4)
                    keep = j >= least
                    np.maximum.at(table, (_bucket(hv[keep], self.num_buckets).astype(np.int64), slot), val[keep])

    def draft(self, seq: np.ndarray, k: int) -> tuple[int, list[int]]:
        """(match_len, draft) from the corpus for context `seq` (`_corpus_draft`)."""
        n, depth = len(seq), self.max_depth
        b2, b4 = key_buckets(seq, self.num_buckets)
        vals = np.concatenate([self.table[0, b4], self.table[1, b2]])
        key_len = [4] * BUCKET_SLOTS + [2] * BUCKET_SLOTS
        corpus, cap = self.tokens, self.capacity
        tail = seq[max(n - depth, 0):][::-1]
        cands = []  # (index, val, cpos, match_len) of the verified candidates
        for i, v in enumerate(vals.tolist()):
            if v < 0 or n < key_len[i]:
                continue
            cpos = v & 0xFFFFFFFF
            if cpos >= cap or corpus[cpos] < 0:
                self.rejected += 1
                continue
            span = corpus[max(cpos - len(tail), 0): cpos][::-1]
            miss = np.flatnonzero(span != tail[: len(span)])
            c_len = int(miss[0]) if miss.size else len(span)
            if c_len < key_len[i]:
                self.rejected += 1
                continue
            if any(c == cpos for _, _, c, _ in cands):
                continue
            cands.append((i, v, cpos, c_len))
        conts = {}
        for _, v, cpos, _ in cands:
            cont = corpus[cpos: min(cpos + k, cap)]
            stop = np.flatnonzero(cont < 0)
            conts[v] = cont[: stop[0] if stop.size else len(cont)].tolist()
        best = (-1, 1, 0, [])  # (num, den, match_len, chain)
        seen_len = set()
        for _, _, _, L in cands:
            if L in seen_len:
                continue
            seen_len.add(L)
            alive = [v for _, v, _, c_len in cands if c_len >= L]
            den, num, chain = max(len(alive), 1), 0, []
            for d in range(k):
                has = [v for v in alive if len(conts[v]) > d]
                if not has:
                    break
                votes: dict[int, int] = {}
                for v in has:
                    votes[conts[v][d]] = votes.get(conts[v][d], 0) + 1
                cmax = max(votes.values())
                tok = conts[max(v for v in has if votes[conts[v][d]] == cmax)][d]  # ties: the newest candidate
                num += cmax
                chain.append(tok)
                alive = [v for v in has if conts[v][d] == tok]
            lhs, rhs = num * best[1], best[0] * den
            if lhs > rhs or (lhs == rhs and best[2] < L):
                best = (num, den, L, chain)
        return best[2], best[3]


class Vllm034SuffixReplay:
    """vLLM 0.34's `suffix` speculator, replayed in numpy, with its defaults."""

    name = "vllm034_suffix_np"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        max_tree_depth: int = pydantic.Field(default=24, ge=1)
        corpus_tokens: int = pydantic.Field(default=1 << 20, ge=0, lt=1 << 31)
        max_cached_requests: int = pydantic.Field(default=10000, ge=0, description="0 turns the corpus off")
        adaptive_verification: bool = pydantic.Field(
            default=False, description="give the per-position confidences vLLM hands its adaptive verification")
        verified: Literal["all", "drafted"] = pydantic.Field(
            default="all", description="slots the target verified, for the statistics: all K, or the drafted ones")

    def __init__(self, **options: Any) -> None:
        self.options = o = self.Options(**options)
        has_corpus = o.corpus_tokens > 0 and o.max_cached_requests != 0 and o.max_tree_depth >= 2
        self.corpus = SuffixCorpus(o.corpus_tokens, o.max_tree_depth) if has_corpus else None
        self.k: int | None = None
        self.stats: np.ndarray | None = None  # [2 * NUM_LEN_BUCKETS, K, 2] (accepted, observed)
        self.num_steps = 0
        # per request: committed tokens seen, prompt length, the last draft's (bucket, valid, verified)
        self.seen: dict[Hashable, int] = {}
        self.prompt_len: dict[Hashable, int] = {}
        self.last: dict[Hashable, tuple[int, int, int]] = {}
        self.tokens: dict[Hashable, np.ndarray] = {}
        self.drafted_from: dict[Hashable, tuple[str, int]] = {}  # the last draft's source and match length

    def _observe(self, req_id: Hashable, num_sampled: int) -> None:
        """Fold the target's verdict on the request's last draft into the statistics (`_suffix_observe_kernel`)."""
        bucket, valid, verified = self.last.pop(req_id, (-1, 0, 0))
        if bucket < 0 or num_sampled == 0:
            return
        accepted = num_sampled - 1
        observed = min(accepted + 1, verified, valid, self.k)
        self.stats[bucket, :observed, 1] += 1
        self.stats[bucket, : min(accepted, observed), 0] += 1

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        if self.k is None:
            self.k = requests[0].max_draft
            self.stats = np.zeros((2 * NUM_LEN_BUCKETS, self.k, 2), dtype=np.int64)
        o, k = self.options, self.k
        for r in requests:
            if r.max_draft != k:
                raise ValueError(f"proposer vllm034_suffix_np: one K per replay (built for {k}, got {r.max_draft})")
        if o.adaptive_verification:
            for r in requests:
                if r.req_id in self.seen:
                    self._observe(r.req_id, len(r.tokens) - self.seen[r.req_id])
            self.num_steps += 1
            if self.num_steps % STATS_HALF_LIFE == 0:
                self.stats >>= 1
        out = []
        for r in requests:
            seq = np.asarray(r.tokens, dtype=np.int64)
            if r.req_id not in self.seen:  # the prefill; its last token is the first one sampled
                self.prompt_len[r.req_id] = len(seq) - 1
            self.seen[r.req_id] = len(seq)
            self.tokens[r.req_id] = seq
            l_len, end = local_match(seq, o.max_tree_depth)
            draft = seq[end: end + k].tolist() if l_len else []
            match_len, source = l_len, 0
            if self.corpus is not None:
                g_len, g_draft = self.corpus.draft(seq, k)
                if g_len > l_len:
                    draft, match_len, source = g_draft, g_len, 1
            self.drafted_from[r.req_id] = (("local", "corpus")[source], match_len) if draft else ("", 0)
            conf = None
            if o.adaptive_verification:
                bucket = source * NUM_LEN_BUCKETS + len_bucket(max(match_len, 1))
                acc = self.stats[bucket, : len(draft), 0].astype(np.float32)
                obs = self.stats[bucket, : len(draft), 1].astype(np.float32)
                conf = ((acc + np.float32(1)) / (obs + np.float32(2))).tolist()
                verified = k if o.verified == "all" else len(draft)
                self.last[r.req_id] = (bucket if draft else -1, len(draft), verified)
            out.append(Draft(draft, confidence=conf))
        return out

    def draft_kind(self, req_id: Hashable) -> str:
        """Where the request's last draft came from: "local" (its own history) or "corpus" (core.ReportsDraftKind)."""
        return self.drafted_from.get(req_id, ("", 0))[0]

    def match_len(self, req_id: Hashable) -> int:
        """The matched suffix length behind the request's last draft (0: no draft)."""
        return self.drafted_from.get(req_id, ("", 0))[1]

    def finish(self, req_id: Hashable) -> None:
        """Add the finished response to the corpus (`on_requests_finished`)."""
        self.drafted_from.pop(req_id, None)
        seq = self.tokens.pop(req_id, None)
        if seq is None:
            return
        self.seen.pop(req_id)
        self.last.pop(req_id, None)
        prompt_len = self.prompt_len.pop(req_id)
        if self.corpus is None:
            return
        end = len(seq)
        start = max(max(prompt_len - PROMPT_CONTEXT, 0), end - (self.corpus.capacity - 1))
        self.corpus.ingest(seq[start:end])


def ngram_match(seq: np.ndarray, min_n: int, max_n: int) -> tuple[int, int]:
    """(n, pos) of vLLM 0.34's GPU `ngram` (`_ngram_scan_kernel`): the longest n in [min_n, max_n] whose last n
    tokens occur earlier at `pos` (the window may overlap the suffix, not be it), the latest such pos; (0, 0) for
    none."""
    total, best = len(seq), (0, 0)
    for n in range(min_n, max_n + 1):
        if total - n - 1 < 0:
            break
        tail = seq[total - n:]
        cand = np.flatnonzero(seq[: total - n] == tail[0])
        for j in range(1, n):
            cand = cand[seq[cand + j] == tail[j]]
        if cand.size:
            best = (n, int(cand[-1]))
    return best


class Vllm034NgramReplay:
    """vLLM 0.34's GPU `ngram` speculator (`v1/worker/gpu/spec_decode/ngram/`), replayed in numpy: the draft is what
    followed the match, up to K tokens and the context's end. Its defaults: n from 5 to 5 (`prompt_lookup_min` /
    `prompt_lookup_max` unset); vLLM's V1 prompt lookup (`vllm_ngram`) is the same rule with our 2-5."""

    name = "vllm034_ngram_np"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        min_n: int = pydantic.Field(default=5, ge=1, description="prompt_lookup_min")
        max_n: int = pydantic.Field(default=5, ge=1, description="prompt_lookup_max")

        @pydantic.model_validator(mode="after")
        def _ordered(self) -> "Vllm034NgramReplay.Options":
            if self.min_n > self.max_n:
                raise ValueError(f"min_n {self.min_n} must be <= max_n {self.max_n}")
            return self

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        o, out = self.options, []
        for r in requests:
            seq = np.asarray(r.tokens, dtype=np.int64)
            n, pos = ngram_match(seq, o.min_n, o.max_n)
            out.append(Draft(seq[pos + n: pos + n + r.max_draft].tolist() if n else []))
        return out

    def finish(self, req_id: Hashable) -> None:
        return None
