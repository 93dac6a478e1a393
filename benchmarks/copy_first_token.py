"""The suffix tree's first drafted token, by what chose it: replayed as `replay` does (greedy, K = 16).

    .venv/bin/python benchmarks/copy_first_token.py --workload benchmarks/workloads/e2e_mix.jsonl \\
        [--options '{"copy_disagree_factor": 1.0}']

Each step drafts with the suffix tree (its options) and, on the same history, with copy drafts off (the count
candidate alone). Steps where the request has a copy source are grouped by: whether the copy's first token equals
the count candidate's (agree / differ), which candidate the draft came from (copy / count), whether the copy was
found near where the last long copy broke off, and the copy's match length (capped at 4). Per group: how often the
drafted first token was right, the confidence it claimed, and how often the other candidate's first token was.
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np
from tqdm import tqdm

from spec_plugins.bench.replay import TextTokenizer, accepted_prefix, load_workload
from spec_plugins.core import DraftRequest
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", action="append", required=True, help="JSONL of {id, prompt, response} (repeatable)")
    ap.add_argument("--options", default="{}", help="the suffix tree's options, a JSON object")
    ap.add_argument("--max-draft", type=int, default=16)
    args = ap.parse_args()
    options = json.loads(args.options)
    tokenizer = TextTokenizer()
    for path in args.workload:
        rows = load_workload(path, tokenizer)
        ours, counts = SuffixTreeProposer(**options), SuffixTreeProposer(**{**options, "copy_drafts": False})
        # group -> [steps, drafted first token right, its confidence summed, the other candidate's first right]
        groups: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0, 0])
        for row in tqdm(rows, desc=path, leave=False):
            seq = np.concatenate([row.prompt, row.response]).astype(np.int32)
            p, n = len(row.prompt), len(row.response)
            seen, i = 0, 1
            while i < n:
                end = p + i
                req = DraftRequest(row.id, seq[:end], end - seen, args.max_draft)
                (draft,) = ours.propose([req])
                (count,) = counts.propose([req])
                src, length, _, near = ours._core._copy_state(ours._key(row.id))
                if draft.tokens and count.tokens and 0 <= src < end:
                    copy_first, count_first, truth = int(seq[src]), count.tokens[0], int(seq[end])
                    kind = ours.draft_kind(row.id)
                    other = count_first if kind == "copy" else copy_first
                    key = (f"{'agree' if copy_first == count_first else 'differ'} {kind}"
                           f"{' near' if near else ''} L{min(length, 4)}")
                    g = groups[key]
                    g[0] += 1
                    g[1] += draft.tokens[0] == truth
                    g[2] += draft.confidence[0]
                    g[3] += other == truth
                seen = end
                i += accepted_prefix(draft.tokens, seq[end:]) + 1
            ours.finish(row.id)
            counts.finish(row.id)
        print(f"{path}: first drafted token right / claimed (the other candidate's first token right), steps")
        for key in sorted(groups):
            steps, right, claimed, other = groups[key]
            if steps >= 20:
                print(f"  {key:22s} {right / steps:.2f} / {claimed / steps:.2f} ({other / steps:.2f}), {steps}")


if __name__ == "__main__":
    main()
