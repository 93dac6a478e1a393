"""Every command, given a bad argument or file: exit code != 0, and one last line that names the field or file
and what was expected; never a traceback. Nothing here starts an engine (the checks come first)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spec_plugins.cli import main as cli_main
from spec_plugins.traces import TRACE_FORMAT

from test_policy_planner import make_trace


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse: usage, then one "error:" line
        rc = exc.code
    return rc, capsys.readouterr().err


def fill(arg: str, files: dict) -> str:
    for key, value in files.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def last_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture
def files(tmp_path):
    def write(name: str, text: str):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    trace = str(make_trace(tmp_path))
    doc = json.loads(open(trace).read())
    doc["proposer"] = "arctic"
    return {
        "dir": str(tmp_path),
        "missing": str(tmp_path / "missing.jsonl"),
        "trace": trace,
        "trace_arctic": write("arctic.json", json.dumps(doc)),
        "trace_list": write("list.json", "[1, 2, 3]"),
        "trace_wrong_shape": write("shape.json", json.dumps({"format": TRACE_FORMAT, "proposer": "ngram",
                                                              "max_draft": 4, "requests": "all of them"})),
        "trace_bad_step": write("step.json", json.dumps({"format": TRACE_FORMAT, "proposer": "ngram", "max_draft": 4,
                                                          "requests": [{"id": "a", "prompt_len": 3, "response_len": 2,
                                                                        "steps": [{"pos": 0, "drafted": "four",
                                                                                   "accepted": 0}]}]})),
        "yaml_bad_hw": write("bad_hw.yaml", "speculative_config:\n  decoding_type: UserProvided\n  max_draft_len: 4\n"
                                            "spec_plugins:\n  proposer: suffix_tree\n  policy: adaptive\n"
                                            "  policy_options: {hardware: h900}\n"),
        "yaml_syntax": write("syntax.yaml", "speculative_config: [unclosed\n"),
        "jsonl_no_response": write("noresp.jsonl", json.dumps({"id": "a", "prompt": "hi"}) + "\n"),
        "jsonl_empty": write("empty.jsonl", "\n"),
        "jsonl_ok": write("ok.jsonl", json.dumps({"id": "a", "prompt": "hi", "response": "there"}) + "\n"),
    }


CASES = {  # name -> (argv with {file} placeholders, text the last line must contain)
    "models: unknown name": (["models", "mistral"], "invalid choice: 'mistral'"),
    "demo: k": (["demo", "--k", "0"], "--k: expected an integer >= 1"),
    "demo: policy options JSON": (["demo", "--proposers", "suffix_tree+adaptive", "--policy-options", "{bad"],
                                  "--policy-options: expected a JSON object"),
    "demo: unknown proposer": (["demo", "--proposers", "sufix_tree"], "unknown name 'sufix_tree'"),
    "demo: hardware": (["demo", "--proposers", "suffix_tree+adaptive", "--policy-options", '{"hardware": "h900"}'],
                       "policy_options.hardware: unknown profile 'h900'"),
    "demo: missing workload": (["demo", "--workload", "{missing}"], "missing.jsonl"),
    "profile: batch sizes": (["profile", "--out", "{dir}/p.json", "--batch-sizes", "one"], "--batch-sizes"),
    "profile: dtype": (["profile", "--out", "{dir}/p.json", "--dtype", "float8"], "--dtype"),
    "trtllm check: missing file": (["trtllm", "check", "{missing}"], "failed the check"),
    "trtllm check: field path": (["trtllm", "check", "{yaml_bad_hw}"], "failed the check"),
    "trtllm check: YAML syntax": (["trtllm", "check", "{yaml_syntax}"], "failed the check"),
    "train-drafter: kind": (["train-drafter", "--target", "{dir}", "--data", "{jsonl_ok}", "--out", "{dir}/d",
                             "--kind", "medusa"], "--kind"),
    "train-drafter: target": (["train-drafter", "--target", "{dir}", "--data", "{missing}", "--out", "{dir}/d"],
                              "--target: "),
    "sweep: methods": (["sweep", "--methods", "none,medusa", "--out", "{dir}/s"], "--methods"),
    "sweep: missing workload": (["sweep", "--workload", "{missing}", "--out", "{dir}/s"], "missing.jsonl"),
    "sweep: render without results": (["sweep", "--render", "--out", "{dir}/nothing"], "nothing"),
    "plan: trace is a list": (["plan", "--hardware", "h200", "--model-config", "llama-3.1-8b", "--acceptance",
                               "{trace_list}", "--mechanism", "ngram", "--max-draft", "4", "--out", "{dir}/o"],
                              "not a replay trace"),
    "plan: trace of the wrong shape": (["plan", "--hardware", "h200", "--model-config", "llama-3.1-8b",
                                        "--acceptance", "{trace_wrong_shape}", "--mechanism", "ngram", "--max-draft",
                                        "4", "--out", "{dir}/o"], "requests: "),
    "plan: step field": (["plan", "--hardware", "h200", "--model-config", "llama-3.1-8b", "--acceptance",
                          "{trace_bad_step}", "--mechanism", "ngram", "--max-draft", "4", "--out", "{dir}/o"],
                         "requests.0.steps.0.drafted"),
    "plan: max draft above the trace's": (["plan", "--hardware", "h200", "--model-config", "llama-3.1-8b",
                                           "--acceptance", "{trace}", "--mechanism", "ngram", "--max-draft", "16",
                                           "--out", "{dir}/o"], "expected --max-draft <= 8"),
    "plan: mechanism differs from the trace's": (["plan", "--hardware", "h200", "--model-config", "llama-3.1-8b",
                                                  "--acceptance", "{trace_arctic}", "--mechanism", "suffix_tree",
                                                  "--max-draft", "8", "--out", "{dir}/o"],
                                                 "recorded proposer 'arctic' (mechanism 'suffix')"),
    "plan: hardware": (["plan", "--hardware", "h900", "--model-config", "llama-3.1-8b", "--acceptance", "{trace}",
                        "--mechanism", "ngram", "--max-draft", "8", "--out", "{dir}/o"], "unknown profile 'h900'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_last_line(case, files, capsys):
    argv, expected = CASES[case]
    argv = [fill(a, files) for a in argv]
    rc, err = run_cli(argv, capsys)
    assert rc not in (0, None), (case, err)
    assert "Traceback" not in err, err
    assert expected in last_line(err), (case, err)


def test_trtllm_check_names_the_field_and_the_file(files):
    res = subprocess.run([sys.executable, "-m", "spec_plugins.cli", "trtllm", "check", files["yaml_bad_hw"],
                          files["missing"], files["yaml_syntax"]], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    fails = [line for line in res.stdout.strip().splitlines() if line.startswith("FAIL")]
    assert len(fails) == 3, res.stdout
    assert "spec_plugins.policy_options.hardware: unknown profile 'h900'" in fails[0], fails
    assert "missing.jsonl" in fails[1] and "syntax.yaml" in fails[2], fails
    assert last_line(res.stderr) == "spec-plugins: error: 3 of 3 config(s) failed the check"


REPLAY_CASES = {
    "missing file": ("{missing}", "--workload {missing}: no such file"),
    "empty workload": ("{jsonl_empty}", "no rows"),
    "row without response": ("{jsonl_no_response}", "missing field 'response'"),
}


@pytest.mark.parametrize("case", sorted(REPLAY_CASES))
def test_replay_bad_workload(case, files, capsys):
    from spec_plugins.bench import replay
    from spec_plugins.tiny_models import build_local_tokenizer

    tok = build_local_tokenizer(files["dir"] + "/tok")
    del tok
    workload, expected = REPLAY_CASES[case]
    capsys.readouterr()
    rc = replay.main(["--workload", fill(workload, files), "--proposers", "ngram", "--tokenizer",
                      files["dir"] + "/tok", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert fill(expected, files) in " ".join(err.split()), err
