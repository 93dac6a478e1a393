"""The host-time benchmark runs end to end on tiny batches and its JSON feeds the simulator's HostTime."""

from __future__ import annotations

import json

import pytest

from spec_plugins.bench import step_overhead
from spec_plugins.bench.host_time import HostTime


@pytest.mark.smollm2
# vLLM's own n-gram kernel (numba) and its imports warn about their own deprecations.
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_step_overhead_measures_every_proposer_and_writes_host_time(tmp_path, capsys):
    out = tmp_path / "so.json"
    step_overhead.main(["--batches", "1,3", "--steps", "2", "--warmup", "1", "--k", "4", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["format"] == step_overhead.FORMAT and doc["k"] == 4
    names = {r["proposer"] for r in doc["rows"]}
    assert names == {"suffix_tree fixed", "suffix_tree adaptive", "ngram fixed", "ngram adaptive",
                     "vLLM suffix (ArcticInference)", "vLLM ngram (numba)"}
    for r in doc["rows"]:
        assert r["us_per_step"] > 0 and r["us_per_request"] == pytest.approx(r["us_per_step"] / r["batch"])
        if r["proposer"].startswith("vLLM suffix"):
            assert r["vs_vllm_suffix"] == 1.0
    assert "x vLLM suffix" in capsys.readouterr().out
    host = HostTime.load(out, "suffix_tree")
    # Interpolated between the measured sizes, per request beyond the largest.
    assert host.seconds("fixed", 6) == pytest.approx(2 * host.seconds("fixed", 3))
    with pytest.raises(ValueError, match="no rows for 'dflash fixed'"):
        HostTime.load(out, "dflash")
