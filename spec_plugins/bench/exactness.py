"""Is speculative sampling distributionally exact? Two samples of continuations, one test per position.

Each continuation of a prompt is one independent draw from the engine's sampling distribution, so the
token at position t over N continuations is N independent draws of that position's marginal. With and
without speculation (same prompt, same sampling parameters) the marginals must match at every position;
a two-sample chi-square test on the (sample x token) table checks each, and the smallest p-value times
the number of positions tested (Bonferroni) is the verdict. Tokens seen fewer than `min_count` times in
both samples together are pooled into one cell so that expected counts stay large enough for the test.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Exactness:
    p_values: list[float]  # one per tested position
    tokens: int  # sampled tokens compared (both samples, tested positions)

    @property
    def p_value(self) -> float:
        """Bonferroni-adjusted: the chance of a p-value this small at any position if the samples agree."""
        return min(1.0, min(self.p_values) * len(self.p_values)) if self.p_values else 1.0


def position_chi_square(a: list[list[int]], b: list[list[int]], positions: int, min_count: int = 10) -> Exactness:
    """Compare the token at each of the first `positions` positions of samples `a` and `b` (token-id lists)."""
    from scipy.stats import chi2_contingency

    if not a or not b:
        raise ValueError("samples: expected two non-empty lists of continuations")
    p_values, tokens = [], 0
    for t in range(positions):
        ca = Counter(seq[t] for seq in a if len(seq) > t)
        cb = Counter(seq[t] for seq in b if len(seq) > t)
        cells = sorted(set(ca) | set(cb))
        big = [c for c in cells if ca[c] + cb[c] >= min_count]
        rest = [c for c in cells if ca[c] + cb[c] < min_count]
        rows = [[ca[c] for c in big], [cb[c] for c in big]]
        if rest:
            rows[0].append(sum(ca[c] for c in rest))
            rows[1].append(sum(cb[c] for c in rest))
        tokens += sum(rows[0]) + sum(rows[1])
        if len(rows[0]) < 2 or not sum(rows[0]) or not sum(rows[1]):
            continue  # one token only (or an empty side): nothing to compare at this position
        p_values.append(float(chi2_contingency(rows).pvalue))
    return Exactness(p_values, tokens)
