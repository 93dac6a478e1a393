"""Where each drafter wins: two proposers drafting on the same contexts, position by position.

    python -m spec_plugins.bench.paired --workload benchmarks/workloads/code_edits.jsonl \\
        --proposers suffix_tree,vllm034_suffix_np --max-draft 16 --json out.json

A replay (`spec_plugins.bench.replay`) walks each proposer along its own accepted tokens, so two proposers draft
at different positions and their step counts differ. Here both draft at every response position (the prompt plus
the response up to it, ingested one token at a time, rows in file order, each finished before the next), so every
comparison is on the same context. Each draft is scored as the target verifies it: padded to K with the last
token and every slot verified (`--accounting mrv2`, Model Runner V2), or the drafted tokens only (`drafted`).

Reported per workload, for A (the first proposer) against B (the second):

* mean accepted tokens per position of each, and of the oracle that takes the better of the two at every position
  (what a perfect choice between their candidates would gain);
* the share of positions where A wins, B wins, or they tie, and the accepted tokens A gains where it wins and
  loses where B wins;
* the acceptance length of each as a walk over these positions (what `bench.replay` reports; a proposer whose
  state depends on the path it walked can differ slightly there) and of a walk taking the better draft at every
  step: the most a perfect choice between the two candidates could give;
* the same split by where each drafted from (`draft_kind`: the suffix tree's "copy" and "count", vLLM 0.34's
  "local" and "corpus", "-" for no draft) and by the match length behind B's draft where B reports it.

Positions are weighted equally, not as a walk weights them (a walk skips the positions a long acceptance covers);
the acceptance lengths of `bench.replay` remain the figure of merit, this says where the difference comes from.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from spec_plugins.bench.replay import (TextTokenizer, load_workload, make_proposer, parse_options, verified)
from spec_plugins.core import DraftRequest, ReportsDraftKind

FORMAT = "spec-plugins-paired/1"
MATCH_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 1 << 30))


def bucket_name(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi}"


def match_bucket(m: int) -> str:
    for lo, hi in MATCH_BUCKETS:
        if lo <= m <= hi:
            return bucket_name(lo, hi)
    raise ValueError(f"match length {m}")


def score_positions(rows: list, names: tuple[str, str], options: dict[str, dict[str, Any]], k: int,
                    fill: bool, progress: bool = False) -> dict[str, np.ndarray]:
    """Every response position of every row: accepted tokens of each proposer's draft, its kind and (where the
    proposer reports one: `match_len(req_id)`) its match length."""
    props = [make_proposer(n, options.get(n), verifies_all=fill) for n in names]
    acc: list[list[int]] = [[], []]
    kind: list[list[str]] = [[], []]
    match: list[list[int]] = [[], []]
    row_of: list[int] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(r.response) - 1 for r in rows), unit="pos", desc="paired", leave=False)
    for ri, row in enumerate(rows):
        seq = np.concatenate([row.prompt, row.response]).astype(np.int32)
        p, n = len(row.prompt), len(row.response)
        for i in range(1, n):
            end = p + i
            truth, last = seq[end:], int(seq[end - 1])
            for j, prop in enumerate(props):
                req = DraftRequest(row.id, seq[:end], end if i == 1 else 1, k)
                draft = prop.propose([req])[0]
                acc[j].append(verified(draft.tokens, truth, k if fill else None, last))
                reports = isinstance(prop, ReportsDraftKind) and len(draft.tokens) > 0
                kind[j].append(prop.draft_kind(row.id) if reports else "-")
                match[j].append(prop.match_len(row.id) if hasattr(prop, "match_len") and len(draft.tokens) else -1)
            row_of.append(ri)
        for prop in props:
            prop.finish(row.id)
        if bar is not None:
            bar.update(n - 1)
    if bar is not None:
        bar.close()
    return {"a": np.array(acc[0]), "b": np.array(acc[1]), "kind_a": np.array(kind[0]), "kind_b": np.array(kind[1]),
            "match_a": np.array(match[0]), "match_b": np.array(match[1]), "row": np.array(row_of)}


def split(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Win/tie/loss shares and the accepted tokens won and lost, of A against B on the same positions."""
    n = len(a)
    if n == 0:
        return {"positions": 0}
    win, lose = a > b, a < b
    return {
        "positions": int(n),
        "a_mean": round(float(a.mean()), 4),
        "b_mean": round(float(b.mean()), 4),
        "oracle_mean": round(float(np.maximum(a, b).mean()), 4),
        "a_wins": round(float(win.mean()), 4),
        "b_wins": round(float(lose.mean()), 4),
        "ties": round(float((a == b).mean()), 4),
        "a_gain": int((a - b)[win].sum()),
        "a_loss": int((b - a)[lose].sum()),
    }


def walk_length(accepted: np.ndarray, row: np.ndarray) -> float:
    """The acceptance length of a greedy walk over these positions (as `bench.replay` walks: from each row's first
    drafted position, on by accepted + 1), read off the per-position scores."""
    steps = tokens = 0
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]]) if len(row) else np.array([], dtype=np.int64)
    for lo, hi in zip(starts.tolist(), np.r_[starts[1:], len(row)].tolist()):
        i = 0
        while i < hi - lo:
            x = int(accepted[lo + i])
            steps, tokens, i = steps + 1, tokens + x + 1, i + x + 1
    return tokens / max(steps, 1)


def summarize(scores: dict[str, np.ndarray]) -> dict[str, Any]:
    a, b = scores["a"], scores["b"]
    total = len(a)
    out: dict[str, Any] = {"all": split(a, b), "by_kind": {}, "by_match_b": {}, "by_match_a": {}}
    # The walks: what bench.replay reports (positions a long acceptance covers are skipped), and the walk of a
    # perfect choice between the two drafts at every step -- the most that choosing between them can give.
    out["walk"] = {"a": round(walk_length(a, scores["row"]), 4), "b": round(walk_length(b, scores["row"]), 4),
                   "oracle": round(walk_length(np.maximum(a, b), scores["row"]), 4)}
    pairs = defaultdict(list)
    for i, (ka, kb) in enumerate(zip(scores["kind_a"].tolist(), scores["kind_b"].tolist())):
        pairs[f"{ka} / {kb}"].append(i)
    for key in sorted(pairs, key=lambda k: -len(pairs[k])):
        idx = np.array(pairs[key])
        out["by_kind"][key] = {**split(a[idx], b[idx]), "share": round(len(idx) / total, 4)}
    for side, field in (("by_match_b", "match_b"), ("by_match_a", "match_a")):
        m = scores[field]
        if (m < 0).all():
            continue
        for lo, hi in MATCH_BUCKETS:
            idx = np.flatnonzero((m >= lo) & (m <= hi))
            if idx.size:
                out[side][bucket_name(lo, hi)] = {**split(a[idx], b[idx]), "share": round(idx.size / total, 4)}
    return out


def print_table(name: str, names: tuple[str, str], summary: dict[str, Any], file: Any = sys.stdout) -> None:
    a, b = names
    s = summary["all"]
    print(f"\n{name}: {s['positions']} positions; mean accepted {a} {s['a_mean']}, {b} {s['b_mean']} "
          f"({s['a_mean'] / max(s['b_mean'], 1e-9):.3f}x), the better of the two {s['oracle_mean']}", file=file)
    w = summary["walk"]
    print(f"walked (acceptance length): {a} {w['a']}, {b} {w['b']} ({w['a'] / w['b']:.3f}x), the better of the two at "
          f"every step {w['oracle']} ({w['oracle'] / w['b']:.3f}x {b})", file=file)
    print(f"{'':24} {'share':>6} {a[:10]:>10} {b[:10]:>10} {'A wins':>7} {'B wins':>7} {'A gains':>8} {'A loses':>8}",
          file=file)
    for title, table in (("kind A / kind B", summary["by_kind"]), (f"match length, {b}", summary["by_match_b"]),
                         (f"match length, {a}", summary["by_match_a"])):
        if not table:
            continue
        print(f"  {title}", file=file)
        for key, r in table.items():
            print(f"  {key:22} {r['share']:6.3f} {r['a_mean']:10.3f} {r['b_mean']:10.3f} {r['a_wins']:7.3f} "
                  f"{r['b_wins']:7.3f} {r['a_gain']:8d} {r['a_loss']:8d}", file=file)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", required=True, help="replay workload JSONL (repeatable)")
    ap.add_argument("--proposers", default="suffix_tree,vllm034_suffix_np", help="A,B: two proposer names")
    ap.add_argument("--options", action="append", default=[], help="NAME=JSON options, as bench.replay takes them")
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--accounting", choices=("mrv2", "drafted"), default="mrv2")
    ap.add_argument("--limit", type=int, default=None, help="rows per workload")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = tuple(n.strip() for n in args.proposers.split(",") if n.strip())
    if len(names) != 2:
        ap.error(f"--proposers: expected two names A,B, got {args.proposers!r}")
    if args.max_draft < 1:
        ap.error(f"--max-draft: expected a positive K, got {args.max_draft}")
    try:
        options = parse_options(args.options)
    except ValueError as exc:
        ap.error(str(exc))
    tok = TextTokenizer(args.tokenizer)
    result: dict[str, Any] = {"format": FORMAT, "config": {"proposers": list(names), "max_draft": args.max_draft,
                                                             "accounting": args.accounting, "options": options,
                                                             "limit": args.limit}, "workloads": {}}
    for path in args.workload:
        rows = load_workload(path, tok, args.limit)
        scores = score_positions(rows, names, options, args.max_draft, args.accounting == "mrv2",
                                 progress=sys.stderr.isatty())
        name = Path(path).stem
        summary = summarize(scores)
        result["workloads"][name] = summary
        print_table(name, names, summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
