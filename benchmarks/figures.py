"""The plots of docs/results.md (and the README's), redrawn from the measurements committed in benchmarks/.

    python benchmarks/figures.py [--out docs/img]

Reads only committed files (no engine, no timing, a few seconds) and prints, for each plot, the table of the
numbers it draws, so every figure on the results page can be checked against this output:

- acceptance.png: acceptance length by workload at K = 16, the suffix tree against ArcticInference 0.1.1 (vLLM's
  `suffix`) and vLLM's n-gram, from the replay traces in benchmarks/traces/ (mean of accepted + 1 over every step).
- goodput.png: modelled goodput of ours (suffix tree + adaptive policy) over the best of vLLM's `suffix` and
  `ngram` at their best static K, by batch size, H200 roofline serving a Llama-3.1-8B-shaped target, host time
  charged (benchmarks/policy_sim/versus_native_h200_llama8b_host_whole.json).
- host_time.png: host time of one drafting step by batch size, ours beside vLLM's own proposers
  (benchmarks/host_time/cpu2-step-overhead-2026-12-05-split.json).
- sweep_pareto.png: the sweep's throughput / per-user-speed frontier on vllm serve, vLLM-CPU + SmolLM2
  (benchmarks/sweep-cpu-replicates/results.json), drawn by the sweep's own plot.
- headline.png: the acceptance and host-time panels side by side, for the README.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {"code_edits": "code edits", "spec_bench_smollm2": "chat (Spec-Bench)",
             "code_completion": "code completion", "e2e_mix": "e2e mix"}
REPLAY = {"suffix_tree": "suffix tree (ours)", "arctic": "ArcticInference (vLLM suffix)",
          "vllm_ngram": "vLLM ngram"}
HOST = ["suffix_tree fixed", "suffix_tree adaptive", "ngram fixed", "vLLM suffix (ArcticInference)",
        "vLLM ngram (numba)"]
HOST_TIME = "benchmarks/host_time/cpu2-step-overhead.json"
GOODPUT = "benchmarks/policy_sim/versus_native_h200_llama8b_host_whole.json"
SWEEP = "benchmarks/sweep-cpu-replicates/results.json"
POLICY_SIM = "benchmarks/policy_sim/h200_llama8b_suffix_tree_host.json"
E2E = "benchmarks/versus_native_e2e/cpu-e2e-clients3-2026-12-06.json"


def _load(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text())


def acceptance() -> dict[str, dict[str, float]]:
    """Acceptance length per workload and proposer, as the replay counts it: accepted + 1 per step."""
    table: dict[str, dict[str, float]] = {}
    for w in WORKLOADS:
        for p in REPLAY:
            trace = _load(f"benchmarks/traces/{w}/{p}.json")
            steps = [s["accepted"] + 1 for r in trace["requests"] for s in r["steps"]]
            table.setdefault(w, {})[p] = sum(steps) / len(steps)
    return table


def host_time() -> dict[str, dict[int, float]]:
    rows = _load(HOST_TIME)["rows"]
    return {p: {r["batch"]: r["us_per_step"] for r in rows if r["proposer"] == p} for p in HOST}


def goodput() -> dict[str, dict[int, tuple[float, str, int]]]:
    """ours + adaptive / the best native at its best static K, per workload and batch, with that native."""
    out: dict[str, dict[int, tuple[float, str, int]]] = {}
    for r in _load(GOODPUT)["rows"]:
        out.setdefault(r["workload"], {})[r["batch"]] = (r["adaptive_vs_native"], r["best_native"], r["best_native_d"])
    return out


def _bars(ax, table: dict[str, dict[str, float]]) -> None:
    width = 0.8 / len(REPLAY)
    for i, (p, label) in enumerate(REPLAY.items()):
        xs = [j + (i - (len(REPLAY) - 1) / 2) * width for j in range(len(WORKLOADS))]
        ys = [table[w][p] for w in WORKLOADS]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(WORKLOADS)), list(WORKLOADS.values()))
    ax.set_ylabel("acceptance length (tokens per step)")
    ax.set_title("Acceptance by workload, replay at K = 16")
    ax.legend(fontsize=8)


def _host(ax, table: dict[str, dict[int, float]]) -> None:
    for p in HOST:
        batches = sorted(table[p])
        ax.plot(batches, [table[p][b] for b in batches], marker="o", label=p,
                linestyle="-" if not p.startswith("vLLM") else "--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("host µs per drafting step")
    ax.set_title("Host time of a drafting step (2-core CPU, K = 16)")
    ax.legend(fontsize=8)


def _goodput(ax, table: dict[str, dict[int, tuple[float, str, int]]]) -> None:
    for w, label in WORKLOADS.items():
        batches = sorted(table[w])
        ax.plot(batches, [table[w][b][0] for b in batches], marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("ours + adaptive / best vLLM method")
    ax.set_title("Modelled goodput, H200 + Llama-3.1-8B shape, host time charged")
    ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "spec-plugins"  # stable output from the same inputs
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    acc, host, good = acceptance(), host_time(), goodput()

    print("acceptance.png: acceptance length at K = 16 (benchmarks/traces/<workload>/<proposer>.json)")
    print("| workload | " + " | ".join(REPLAY) + " | ours / best other |")
    print("|---|" + "---|" * (len(REPLAY) + 1))
    for w in WORKLOADS:
        best_other = max(v for p, v in acc[w].items() if p != "suffix_tree")
        print(f"| {w} | " + " | ".join(f"{acc[w][p]:.3f}" for p in REPLAY)
              + f" | {acc[w]['suffix_tree'] / best_other:.3f}x |")
    print(f"\nhost_time.png: µs per drafting step ({HOST_TIME})")
    batches = sorted(next(iter(host.values())))
    print("| proposer | " + " | ".join(f"B = {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for p in HOST:
        print(f"| {p} | " + " | ".join(f"{host[p][b]:,.0f}" for b in batches) + " |")
    ratio = {r["proposer"]: r["vs_vllm_suffix"] for r in _load(HOST_TIME)["rows"] if r["batch"] == max(batches)}
    print(f"at B = {max(batches)}, x vLLM suffix: " + ", ".join(f"{p} {ratio[p]:.3f}x" for p in HOST))
    print(f"\ngoodput.png: ours + adaptive / best native (its K) ({GOODPUT})")
    gb = sorted(next(iter(good.values())))
    print("| workload | " + " | ".join(f"B = {b}" for b in gb) + " |")
    print("|---|" + "---|" * len(gb))
    for w in WORKLOADS:
        print(f"| {w} | " + " | ".join(f"{good[w][b][0]:.3f}x ({good[w][b][1]} {good[w][b][2]})" for b in gb) + " |")

    written = []
    for name, draw, size in (("acceptance.png", lambda ax: _bars(ax, acc), (8, 4.5)),
                             ("host_time.png", lambda ax: _host(ax, host), (8, 4.5)),
                             ("goodput.png", lambda ax: _goodput(ax, good), (8, 4.5))):
        fig, ax = plt.subplots(figsize=size, dpi=110)
        draw(ax)
        fig.tight_layout()
        fig.savefig(args.out / name)
        plt.close(fig)
        written.append(name)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), dpi=100)
    _bars(left, acc)
    _host(right, host)
    fig.tight_layout()
    fig.savefig(args.out / "headline.png")
    plt.close(fig)
    written.append("headline.png")

    from spec_plugins.bench.frontier import plot_frontier
    from spec_plugins.bench.sweep import plot_title

    sweep = _load(SWEEP)
    plot_frontier(sweep["rows"], args.out / "sweep_pareto.png",
                  plot_title("SmolLM2-135M-Instruct", sweep["workload"], sweep["max_tokens"], sweep["rounds"]))
    written.append("sweep_pareto.png")
    print(f"\nsweep_pareto.png: frontier {sweep['frontier']} ({SWEEP})")
    print("| concurrency | best adaptive cap | tokens/s | best static K | tokens/s | ratio | paired |")
    print("|---|---|---|---|---|---|---|")
    for a in sweep["adaptive"]:
        print(f"| {a['concurrency']} | {a['adaptive']} | {a['tokens_per_s']:.1f} | {a['best_static']} | "
              f"{a['static_tokens_per_s']:.1f} | {a['ratio']:.3f}x | {a['paired']:.3f}x |")
    tables()
    print(f"\nwrote {', '.join(written)} to {args.out}")


def tables() -> None:
    """The results page's other figures that have no plot, from their committed JSON."""
    sim = _load(POLICY_SIM)["summary"]["rows"]
    print(f"\nadaptive / best static D, suffix tree traces, H200 roofline, host time charged ({POLICY_SIM})")
    print("| batch | " + " | ".join(str(r["batch"]) for r in sim) + " |")
    print("|---|" + "---|" * len(sim))
    print("| adaptive / best static | " + " | ".join(f"{r['adaptive_vs_best_static']:.3f}x" for r in sim) + " |")
    print("| hindsight / best static | " + " | ".join(f"{r['hindsight_vs_best_static']:.3f}x" for r in sim) + " |")
    rows = _load(E2E)["rows"]
    print(f"\nend to end, vLLM-CPU + SmolLM2, output tokens/s, median of rounds ({E2E})")
    print("| concurrency | none | ours + adaptive (AL) | best native (config) | ours / best native | all identical |")
    print("|---|---|---|---|---|---|")
    for c in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == c]
        none = next(r for r in at if r["config"] == "none")
        ours = next(r for r in at if r["config"].startswith("suffix_tree+adaptive"))
        native = max((r for r in at if r["config"].startswith("vllm:")), key=lambda r: r["median_tokens_per_s"])
        print(f"| {c} | {none['median_tokens_per_s']:.1f} | {ours['median_tokens_per_s']:.1f} "
              f"({ours['acceptance_length']:.2f}) | {native['median_tokens_per_s']:.1f} ({native['config']}) | "
              f"{ours['median_tokens_per_s'] / native['median_tokens_per_s']:.3f}x | "
              f"{'yes' if all(r['identical'] for r in at) else 'no'} |")


if __name__ == "__main__":
    main()
