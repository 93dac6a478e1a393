"""The host-time benchmark runs end to end on tiny batches and its JSON feeds the simulator's HostTime."""

from __future__ import annotations

import json

import pytest

from spec_plugins.bench import step_overhead
from spec_plugins.bench.host_time import HostTime
from spec_plugins.proposers.suffix_tree import _testing


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
                     "suffix_tree fixed + ahead", "suffix_tree adaptive + ahead",
                     "vLLM suffix (ArcticInference)", "vLLM ngram (numba)"}
    suffix = {r["batch"]: r["us_per_step"] for r in doc["rows"] if r["proposer"] == "vLLM suffix (ArcticInference)"}
    assert sorted(suffix) == [1, 3]
    for r in doc["rows"]:
        assert r["us_per_step"] > 0 and r["us_per_request"] == pytest.approx(r["us_per_step"] / r["batch"])
        # Each proposer against vLLM's suffix proposer at the same batch size.
        assert r["vs_vllm_suffix"] == pytest.approx(r["us_per_step"] / suffix[r["batch"]])
        # What appending ahead leaves running when propose() returns is timed apart, for those rows only.
        assert (r["ahead_wait_us"] is not None) == r["proposer"].endswith("+ ahead")
        # Ours split off the proposer's own call, a part of the whole step; vLLM's proposers have no such part.
        if r["proposer"].startswith("vLLM"):
            assert r["proposer_us"] is None and r["proposer_vs_vllm_suffix"] is None
        else:
            assert 0 < r["proposer_us"] < r["us_per_step"]
            assert r["proposer_vs_vllm_suffix"] == pytest.approx(r["proposer_us"] / suffix[r["batch"]])
    assert "x vLLM suffix" in capsys.readouterr().out
    host = HostTime.load(out, "suffix_tree")
    # Interpolated between the measured sizes, per request beyond the largest.
    assert host.seconds("fixed", 6) == pytest.approx(2 * host.seconds("fixed", 3))
    with pytest.raises(ValueError, match="no rows for 'dflash fixed'"):
        HostTime.load(out, "dflash")


@pytest.mark.smollm2
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_step_overhead_verifies_drafts_against_a_rewrite(tmp_path):
    """--verify: each proposer's requests grow by its own accepted drafts plus one token; on a rewrite (the answer
    copies the prompt's file) the suffix tree's copies are accepted, so requests grow by more than one a step."""
    out = tmp_path / "so.json"
    step_overhead.main(["--batches", "2", "--steps", "3", "--warmup", "2", "--k", "4", "--verify", "--text", "rewrite",
                        "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["verify"] is True and doc["text"] == "rewrite"
    rows = {r["proposer"]: r for r in doc["rows"]}
    assert rows["suffix_tree fixed"]["tokens_per_request_step"] > 2
    # Appending ahead drafts the same, so its requests grow exactly as the plain suffix tree's.
    assert rows["suffix_tree fixed + ahead"]["tokens_per_request_step"] == rows["suffix_tree fixed"]["tokens_per_request_step"]
    assert all(1 <= r["tokens_per_request_step"] <= 5 for r in doc["rows"])
    with pytest.raises(SystemExit):
        step_overhead.main(["--batches", "2", "--steps", "400", "--verify", "--text", "rewrite"])


def test_append_draft_split_keeps_both_caches_equal():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "append_draft_split", Path(__file__).parents[1] / "benchmarks" / "append_draft_split.py")
    split_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(split_bench)
    times, whole, split = split_bench.measure(3, 4)
    assert all(len(ts) == 4 for ts in times.values())
    for key in range(3):  # appending and drafting apart leaves the trees the whole step leaves
        assert _testing.canonical(whole, key).tolist() == _testing.canonical(split, key).tolist()
