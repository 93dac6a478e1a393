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
from typing import Any, Hashable, Sequence

import numpy as np
from tqdm import tqdm

from spec_plugins.bench.replay import TextTokenizer, load_workload, walk
from spec_plugins.core import Draft, DraftRequest
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer


class BothCandidates:
    """A proposer for `replay.walk`: drafts with the suffix tree and, on the same history, with copy drafts off;
    counts, per group, the first drafted token right, its confidence, and the other candidate's first token right."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.ours = SuffixTreeProposer(**options)
        self.counts = SuffixTreeProposer(**{**options, "copy_drafts": False})
        self.groups: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0, 0])
        self.sequence = np.zeros(0, dtype=np.int32)  # the request being walked, prompt and response

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        (req,) = requests
        (draft,) = self.ours.propose(requests)
        (count,) = self.counts.propose(requests)
        end = len(req.tokens)
        src, length, _, near = self.ours._core._copy_state(self.ours._key(req.req_id))
        if draft.tokens and count.tokens and 0 <= src < end:
            copy_first, count_first, truth = int(self.sequence[src]), count.tokens[0], int(self.sequence[end])
            kind = self.ours.draft_kind(req.req_id)
            other = count_first if kind == "copy" else copy_first
            g = self.groups[f"{'agree' if copy_first == count_first else 'differ'} {kind}"
                            f"{' near' if near else ''} L{min(length, 4)}"]
            g[0] += 1
            g[1] += draft.tokens[0] == truth
            g[2] += draft.confidence[0]
            g[3] += other == truth
        return [draft]

    def finish(self, req_id: Hashable) -> None:
        self.ours.finish(req_id)
        self.counts.finish(req_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", action="append", required=True, help="JSONL of {id, prompt, response} (repeatable)")
    ap.add_argument("--options", default="{}", help="the suffix tree's options, a JSON object")
    ap.add_argument("--max-draft", type=int, default=16)
    args = ap.parse_args()
    options = json.loads(args.options)
    tokenizer = TextTokenizer()
    for path in args.workload:
        both = BothCandidates(options)
        for row in tqdm(load_workload(path, tokenizer), desc=path, leave=False):
            both.sequence = np.concatenate([row.prompt, row.response]).astype(np.int32)
            walk(both, row, args.max_draft)
        print(f"{path}: first drafted token right / claimed (the other candidate's first token right), steps")
        for key in sorted(both.groups):
            steps, right, claimed, other = both.groups[key]
            if steps >= 20:
                print(f"  {key:22s} {right / steps:.2f} / {claimed / steps:.2f} ({other / steps:.2f}), {steps}")


if __name__ == "__main__":
    main()
