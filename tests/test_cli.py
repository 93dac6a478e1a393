"""The `spec-plugins` command: bad input fails in one line before any engine starts."""

from __future__ import annotations

import subprocess
import sys

import pytest


def spec_plugins(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spec_plugins.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--k", "0"], "spec-plugins: error: --k: expected an integer >= 1, got 0"),
        (["demo", "--max-tokens", "-5"], "spec-plugins: error: --max-tokens: expected an integer >= 1, got -5"),
        (["demo", "--native", "eagle"], "spec-plugins: error: --native: expected one of ngram, suffix, got 'eagle'"),
        (["demo", "--proposers", "ngram,nope"], "spec-plugins: error: proposer: unknown name 'nope'; expected one of:"),
    ],
)
def test_demo_bad_input(args, message):
    res = spec_plugins(*args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), res.stderr
    assert "Traceback" not in res.stderr


def test_help_lists_commands():
    res = spec_plugins("--help")
    assert res.returncode == 0
    assert "models" in res.stdout and "demo" in res.stdout
