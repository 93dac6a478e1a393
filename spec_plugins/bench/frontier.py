"""The throughput-interactivity Pareto frontier of a sweep, its plot, and the best configuration per latency target.

A configuration at a load is a point (total output tokens/s, output tokens/s per user): serving wants both
up, and no setting maximises both at once (more concurrency raises the first and lowers the second). The
frontier is the set of points no other point beats on one axis without losing on the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point dominates (>= on both axes, > on one), by increasing x.
    Equal points are all kept: neither beats the other."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    i = 0
    while i < len(order):
        # Points with the same x: only those with the highest y can be on the front, and only above best_y.
        j = i
        x = points[order[i]][0]
        while j < len(order) and points[order[j]][0] == x:
            j += 1
        top = points[order[i]][1]
        if top > best_y:
            front.extend(k for k in order[i:j] if points[k][1] == top)
            best_y = top
        i = j
    return sorted(front, key=lambda k: (points[k][0], -points[k][1]))


def best_per_target(rows: Sequence[dict], tpot_targets_ms: Sequence[float]) -> list[dict]:
    """For each TPOT target: the row with the most total tokens/s whose median TPOT meets it (lossless rows
    only). Returns {"tpot_ms", "row" (or None: nothing meets it)} per target."""
    out = []
    for target in tpot_targets_ms:
        ok = [r for r in rows if r.get("identical", True) and r["tpot_p50_ms"] is not None
              and r["tpot_p50_ms"] <= target]
        best = max(ok, key=lambda r: (r["tokens_per_s"], r["tokens_per_s_per_user"]), default=None)
        out.append({"tpot_ms": target, "row": best})
    return out


def plot_frontier(rows: Sequence[dict], path: str | Path, title: str) -> Path:
    """Tokens/s per user against total tokens/s, one marker per method, bars for the spread over rounds; the
    frontier drawn through the points on it, which are labelled in full (the others by draft length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["tokens_per_s"], r["tokens_per_s_per_user"]) for r in rows]
    front = pareto_front(pts)
    on_front = set(front)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    markers = "osD^v<>phX*"
    fig, ax = plt.subplots(figsize=(11, 7), dpi=120)
    cmap = plt.get_cmap("tab10")
    leader = dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=5)  # drawn once a label is moved
    labels = []
    for m_i, method in enumerate(methods):
        mine = [i for i, r in enumerate(rows) if r["method"] == method]
        color = cmap(m_i % 10)
        for i in mine:  # the spread over rounds first, under the markers
            if rows[i].get("spread"):
                lo, hi = rows[i]["spread"]["tokens_per_s"]
                ax.plot([lo, hi], [pts[i][1]] * 2, color=color, alpha=0.3, lw=2, zorder=1)
        ax.scatter([pts[i][0] for i in mine], [pts[i][1] for i in mine], s=70, marker=markers[m_i % len(markers)],
                   color=color, label=method, zorder=3, edgecolors="black", linewidths=0.5)
        for i in mine:
            r = rows[i]
            k = "" if r["draft_length"] is None else f"K{r['draft_length']}"
            if i in on_front:  # the points worth deploying: named in full
                labels.append(ax.annotate(f"{method} {k} c{r['concurrency']}".replace("  ", " "), pts[i],
                                          textcoords="offset points", xytext=(7, 5), fontsize=8, fontweight="bold",
                                          color=color, zorder=4, arrowprops=leader))  # its method's colour
            elif k:
                labels.append(ax.annotate(k, pts[i], textcoords="offset points", xytext=(5, -9), fontsize=6.5,
                                          color="0.35", arrowprops=leader))
    for c in sorted({r["concurrency"] for r in rows}):  # one cloud per load level: say which
        mine = [pts[i] for i, r in enumerate(rows) if r["concurrency"] == c]
        x = sum(p[0] for p in mine) / len(mine)
        ax.annotate(f"concurrency {c}", (x, max(p[1] for p in mine)), textcoords="offset points", xytext=(0, 16),
                    ha="center", fontsize=9, color="0.3", style="italic")
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="black", lw=1.2, ls="--", zorder=2,
            label="Pareto frontier (bold labels)")
    ax.margins(x=0.06, y=0.1)  # room for the labels at the edges
    ax.set_xlabel("total output tokens/s (throughput)")
    ax.set_ylabel("output tokens/s per user (interactivity)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    _separate(fig, ax, labels, pts)
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def _separate(fig: Any, ax: Any, labels: list, points: Sequence[tuple[float, float]]) -> None:
    """Place each label beside its point where it covers no other label and no marker: configurations of one
    method often land within a label's height of each other, and their names would print on top of one
    another. Tried in turn: right above, right below, left above, left below; failing all, moved down from
    its first place until clear, with a leader line back to its point."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    pt = 72 / fig.dpi  # points per pixel
    half = 5 / pt  # a marker's half width (s=70 is ~8.4 points across), pixels
    placed = []
    for x, y in ax.transData.transform(points):
        placed.append(Bbox.from_extents(x - half, y - half, x + half, y + half))

    def text_box(ann: Any) -> Any:  # the text alone (an annotation's own extent includes its leader line)
        ann.update_positions(renderer)
        return Text.get_window_extent(ann, renderer)

    def first_hit(box: Any) -> Any:
        return next((b for b in placed if box.overlaps(b)), None)

    for ann in sorted(labels, key=lambda a: -text_box(a).y1):  # from the top down
        dx, dy = ann.xyann
        ann.arrow_patch.set_visible(False)
        width = text_box(ann).width * pt
        for offset in ((dx, dy), (dx, -dy - 9), (-dx - width, dy), (-dx - width, -dy - 9)):
            ann.xyann = offset
            if first_hit(text_box(ann)) is None:
                break
        else:
            ann.xyann = (dx, dy)
            ann.arrow_patch.set_visible(True)
            for _ in range(len(placed)):
                box = text_box(ann)
                hit = first_hit(box)
                if hit is None:
                    break
                ann.xyann = (ann.xyann[0], ann.xyann[1] - (box.y1 - hit.y0 + 1) * pt)
        placed.append(text_box(ann))


def frontier_table(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """The frontier's rows, by increasing total tokens/s."""
    return [rows[i] for i in pareto_front([(r["tokens_per_s"], r["tokens_per_s_per_user"]) for r in rows])]
