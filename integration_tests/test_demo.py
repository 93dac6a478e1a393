"""`spec-plugins demo` end to end on a tiny model: the table and the JSON rows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]


def test_demo_writes_rows(tmp_path):
    from spec_plugins.tiny_models import build_tiny_model

    # The demo's real prompts need more context than the default tiny model has.
    tiny_llama = str(build_tiny_model(tmp_path / "tiny", arch="llama", max_position_embeddings=4096))
    out = tmp_path / "rows.json"
    res = subprocess.run(
        [sys.executable, "-m", "spec_plugins.cli", "demo", "--model", tiny_llama, "--max-tokens", "24",
         "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mean accepted length" in res.stdout and "suffix_tree" in res.stdout
    rows = json.loads(out.read_text())
    assert [r["proposer"] for r in rows] == ["none", "suffix_tree"]
    for row in rows:
        assert set(row) == {"proposer", "acceptance_length", "tokens_per_s", "speedup", "identical"}
        assert row["tokens_per_s"] > 0
        assert row["identical"] is True
    base, spec = rows
    assert base["acceptance_length"] == 1.0  # no drafts without speculation
    assert spec["acceptance_length"] > 1.0  # the suffix tree's drafts were accepted
    # the speed-up is the measured throughput ratio, not a constant
    assert spec["speedup"] == pytest.approx(spec["tokens_per_s"] / base["tokens_per_s"], rel=0.01)
