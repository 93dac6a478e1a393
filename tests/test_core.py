"""Core types, registry (including a third-party entry point) and their errors."""

from __future__ import annotations

import sys
import textwrap

import pytest

import spec_plugins
from spec_plugins import registry
from spec_plugins.core import Draft, DraftRequest, FixedLength, apply_policy, check_cap, check_drafts


def test_draft_request_rejects_negative_cap_and_num_new():
    with pytest.raises(ValueError, match=r"max_draft: expected an integer >= 0, got -1"):
        DraftRequest("a", [1, 2], num_new=2, max_draft=-1)
    with pytest.raises(ValueError, match=r"num_new: expected >= 0"):
        DraftRequest("a", [1, 2], num_new=-3, max_draft=1)
    assert DraftRequest("a", [1, 2], num_new=2, max_draft=0).max_draft == 0  # a policy may skip a request


@pytest.mark.parametrize("bad", [0, -2, 1.5, "3", None, True])
def test_check_cap_requires_positive_int(bad):
    with pytest.raises(ValueError, match=r"^K: expected an integer"):
        check_cap(bad, "K")


def test_check_drafts_rejects_long_drafts_and_mismatched_rows():
    reqs = [DraftRequest("a", [1], 1, max_draft=2)]
    check_drafts(reqs, [Draft([7, 8])])
    with pytest.raises(ValueError, match=r"draft for request 'a' has 3 tokens, cap is 2"):
        check_drafts(reqs, [Draft([7, 8, 9])])
    with pytest.raises(ValueError, match=r"returned 2 drafts for 1 requests"):
        check_drafts(reqs, [Draft(), Draft()])
    with pytest.raises(ValueError, match=r"1 prob rows for 2 tokens"):
        check_drafts(reqs, [Draft([7, 8], probs=[[1.0]])])
    with pytest.raises(ValueError, match=r"1 confidences for 2 tokens"):
        check_drafts(reqs, [Draft([7, 8], confidence=[0.5])])


def test_apply_policy_only_lowers_caps():
    reqs = [DraftRequest("a", [1], 1, max_draft=4), DraftRequest("b", [1], 1, max_draft=2)]
    apply_policy(FixedLength(max_draft=3), reqs)
    assert [r.max_draft for r in reqs] == [3, 2]

    class Greedy:
        def caps(self, requests):
            return [100 for _ in requests]

    apply_policy(Greedy(), reqs)
    assert [r.max_draft for r in reqs] == [3, 2]

    class Negative(Greedy):
        def caps(self, requests):
            return [-1 for _ in requests]

    with pytest.raises(ValueError, match=r"policy cap for request 'a': expected an integer >= 0"):
        apply_policy(Negative(), reqs)


def test_registry_names_and_errors():
    assert "ngram" in spec_plugins.available_proposers()
    assert "fixed" in spec_plugins.available_policies()
    with pytest.raises(ValueError, match=r"proposer: unknown name 'nope'; expected one of: .*ngram"):
        spec_plugins.create_proposer("nope")
    with pytest.raises(ValueError, match=r"policy: unknown name 'nope'"):
        spec_plugins.create_policy("nope")
    with pytest.raises(ValueError, match=r"proposer_options\[ngram\]\.max_ngrm: unknown option"):
        spec_plugins.create_proposer("ngram", {"max_ngrm": 3})
    with pytest.raises(ValueError, match=r"proposer_options\[ngram\]\.min_ngram: .*greater than or equal to 1"):
        spec_plugins.create_proposer("ngram", {"min_ngram": 0})
    with pytest.raises(ValueError, match=r"policy_options\.max_draft"):
        spec_plugins.create_policy("fixed", {"max_draft": 0})
    assert isinstance(spec_plugins.create_proposer("ngram", {"max_ngram": 3}), spec_plugins.Proposer)


def test_register_proposer_in_code():
    class Echo:
        def propose(self, requests):
            return [Draft(list(r.tokens[-r.max_draft:])) for r in requests]

        def finish(self, req_id):
            pass

    spec_plugins.register_proposer("echo_test", Echo)
    try:
        p = spec_plugins.create_proposer("echo_test")
        assert p.propose([DraftRequest("x", [1, 2, 3], 3, max_draft=2)])[0].tokens == [2, 3]
    finally:
        registry._proposers.pop("echo_test")
    with pytest.raises(ValueError, match=r"proposer name: expected a non-empty string"):
        spec_plugins.register_proposer("", Echo)


def test_third_party_entry_point(tmp_path, monkeypatch):
    """A package that declares `spec_plugins.proposers` in its metadata is found by name."""
    pkg = tmp_path / "thirdparty_drafter"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from spec_plugins.core import Draft

        class RepeatLast:
            def __init__(self, times: int = 1):
                self.times = times

            def propose(self, requests):
                return [Draft([r.tokens[-1]] * min(self.times, r.max_draft)) for r in requests]

            def finish(self, req_id):
                pass
    """))
    dist = tmp_path / "thirdparty_drafter-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-drafter\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[spec_plugins.proposers]\nrepeat_last = thirdparty_drafter:RepeatLast\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_proposers", {})
    assert {"ngram", "repeat_last"} <= set(spec_plugins.available_proposers())
    assert "thirdparty_drafter" not in sys.modules  # listing names imports nothing
    p = spec_plugins.create_proposer("repeat_last", {"times": 3})
    assert p.propose([DraftRequest("r", [4, 9], 2, max_draft=2)])[0].tokens == [9, 9]
