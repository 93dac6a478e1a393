"""The TensorRT-LLM 1.2 drafter adapter, driven by a CPU stand-in of the executor loop (tests/trtllm_stub.py).

The real engine runs in integration_tests/test_trtllm_engine.py (CUDA hosts with TensorRT-LLM only).
"""

from __future__ import annotations

import inspect
import pickle
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trtllm_stub as stub
from spec_plugins.registry import register_policy

ROOT = Path(__file__).resolve().parents[1]
MODEL_CONFIG = str(ROOT / "configs" / "models" / "llama-3.1-8b.json")
K = 4
PROPOSERS = ["ngram", "suffix_tree"]
POLICIES = {
    "fixed": {},
    "adaptive": {"hardware": "h200", "model_config": MODEL_CONFIG},
}


@pytest.fixture
def trtllm(monkeypatch):
    """TensorRT-LLM's modules: the real ones if importable, else the stand-in."""
    stub.install(monkeypatch)
    from spec_plugins.trtllm import drafter

    return drafter


def make(trtllm, **kw):
    kw.setdefault("max_draft_len", K)
    return trtllm.drafter_class()(**kw)


def workload(ex: stub.StubExecutor, seed: int, n: int = 7, zero_runs: bool = False) -> None:
    """Requests with repetitive text (so drafts get accepted), different lengths (they finish mid-batch)
    and staggered arrivals (new ones join a running batch)."""
    rng = random.Random(seed)
    for i in range(n):
        motif = [rng.randrange(1, 40) for _ in range(rng.randrange(3, 8))]
        reference = []
        while len(reference) < 80:
            reference += motif if rng.random() < 0.8 else [rng.randrange(1, 40)]
        if zero_runs:
            reference[5:9] = [0, 0, 0, 0]
        prompt = motif * 2 + [rng.randrange(1, 40)]
        ex.submit(100 + i, prompt, reference, max_new_tokens=rng.randrange(12, 60), arrival=rng.randrange(0, 12))


def run(drafter, seed=0, n=7, **kw) -> stub.StubExecutor:
    ex = stub.StubExecutor(drafter, max_batch_size=kw.pop("max_batch_size", 3), **kw)
    workload(ex, seed, n)
    ex.run()
    return ex


def outputs(ex) -> dict:
    return {r.py_request_id: ex.output(r) for r in ex.finished}


# ---- lossless through the executor loop -------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_output_identical_to_no_speculation(trtllm, proposer, policy):
    base = run(None)
    drafter = make(trtllm, proposer=proposer, policy=policy, policy_options=POLICIES[policy])
    ex = run(drafter)
    assert outputs(ex) == outputs(base)
    assert all(len(out) == r.py_max_new_tokens for r, out in zip(ex.finished, outputs(ex).values()))
    drafted = sum(len(d) for rec in ex.log for d in rec.drafts.values())
    accepted = sum(min(a, len(rec.drafts[i])) for rec in ex.log for i, a in rec.accepted.items())
    assert drafted > 0 and accepted > 0
    assert ex.step_count < base.step_count  # speculation saved steps
    for rec in ex.log:
        for req_id, draft in rec.drafts.items():
            assert isinstance(draft, list) and all(type(t) is int for t in draft)
            assert len(draft) <= rec.k and len(draft) <= max(0, rec.room[req_id])
            assert rec.padded[req_id] == K  # padded by the base class to the static maximum


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), proposer=st.sampled_from(PROPOSERS),
       schedule=st.sampled_from([None, {1: K, 3: 2}, {1: K, 2: 1, 4: 0}]), batch=st.integers(1, 5))
def test_lossless_for_any_workload_and_schedule(trtllm, seed, proposer, schedule, batch):
    base = run(None, seed=seed, n=5, max_batch_size=batch)
    drafter = make(trtllm, proposer=proposer, draft_len_schedule=schedule)
    ex = run(drafter, seed=seed, n=5, max_batch_size=batch)
    assert outputs(ex) == outputs(base)
    for rec in ex.log:
        if schedule is not None:
            assert rec.k == drafter.get_draft_len_for_batch_size(rec.active)
        assert all(len(d) <= rec.k for d in rec.drafts.values())


# ---- acceptance reaches the policy --------------------------------------------------------------------


class RecordingPolicy:
    instances: list = []

    def __init__(self, **options):
        self.observed, self.finished = [], []
        RecordingPolicy.instances.append(self)

    def caps(self, requests):
        return [r.max_draft for r in requests]

    def observe(self, req_id, drafted, accepted):
        self.observed.append((req_id, drafted, accepted))

    def finish(self, req_id):
        self.finished.append(req_id)


register_policy("trtllm-test-recording", RecordingPolicy)


def expected_observations(ex) -> list:
    """(request, drafted, accepted) for every verified draft whose request was scheduled again."""
    out = []
    for i, rec in enumerate(ex.log):
        for req_id, draft in rec.drafts.items():
            if draft and req_id in rec.accepted and any(req_id in later.drafts for later in ex.log[i + 1:]):
                out.append((req_id, len(draft), min(rec.accepted[req_id], len(draft))))
    return sorted(out, key=lambda o: o[0])


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_num_accepted_draft_tokens_reaches_policy_observe(trtllm, proposer):
    drafter = make(trtllm, proposer=proposer, policy="trtllm-test-recording")
    ex = run(drafter)
    observed = drafter.policy.observed
    assert observed and sorted(observed, key=lambda o: o[0]) == expected_observations(ex)
    assert any(a > 0 for _, _, a in observed)


def test_accepted_pad_tokens_are_not_credited_to_the_proposer(trtllm):
    # One draft token (0) padded with 0s, against a target that emits 0 0 0 0: the sampler accepts
    # all four, the policy hears drafted=1, accepted=1.
    drafter = make(trtllm, proposer="fixed_draft", proposer_options={"length": 1, "token": 0},
                   policy="trtllm-test-recording")
    ex = stub.StubExecutor(drafter, max_batch_size=1)
    ex.submit(1, [7, 8, 9], [5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9], max_new_tokens=14)
    ex.run()
    assert max(rec.accepted.get(1, 0) for rec in ex.log) > 1  # pads were accepted
    assert drafter.policy.observed and all(d == 1 and a <= 1 for _, d, a in drafter.policy.observed)


# ---- per-request state: freed exactly once --------------------------------------------------------------


def count_finishes(drafter):
    calls = Counter()
    proposer = drafter.proposer
    original = proposer.finish

    def finish(req_id):
        calls[req_id] += 1
        original(req_id)

    proposer.finish = finish
    return calls


@pytest.mark.parametrize("with_resource_manager", [False, True])
def test_suffix_tree_state_freed_exactly_once(trtllm, with_resource_manager):
    drafter = make(trtllm, proposer="suffix_tree", policy="trtllm-test-recording")
    calls = count_finishes(drafter)
    rm = trtllm.resource_manager_class()(drafter) if with_resource_manager else None
    ex = run(drafter, spec_resource_manager=rm)
    ids = {r.py_request_id for r in ex.finished}
    if not with_resource_manager:
        # Requests that ended in the last step are noticed at the next call, if any; an idle one frees them.
        drafter.prepare_draft_tokens(stub.ScheduledRequests())
    assert drafter.num_tracked == 0
    assert drafter.proposer.stats()["active_requests"] == 0
    assert set(calls) == ids and all(n == 1 for n in calls.values())
    assert Counter(drafter.policy.finished) == Counter({i: 1 for i in ids})
    assert drafter.proposer.stats()["cached_requests"] == len(ids)  # finished responses feed the global tree


def test_without_resource_manager_a_finished_request_is_freed_at_the_next_call(trtllm):
    drafter = make(trtllm, proposer="suffix_tree")
    ex = stub.StubExecutor(drafter, max_batch_size=4)
    workload(ex, seed=3, n=4)
    active_counts = []
    ex.run(between_steps=lambda e: active_counts.append(
        (len(e.active), drafter.proposer.stats()["active_requests"], len(e.finished))))
    # After each step the proposer holds at most the requests active before the step.
    for (_, held, _), (before, _, _) in zip(active_counts[1:], active_counts):
        assert held <= before


def test_unscheduled_request_keeps_state_until_stale(trtllm):
    drafter = make(trtllm, proposer="suffix_tree", policy="trtllm-test-recording")
    calls = count_finishes(drafter)
    held_out = range(5, 5 + drafter.stale_steps)  # absent for exactly stale_steps calls: kept
    ex = stub.StubExecutor(drafter, max_batch_size=2,
                           unschedule=lambda step, req: req.py_request_id == 1 and step in held_out)
    ex.submit(1, [1, 2, 3, 1, 2], [3, 1, 2] * 30, max_new_tokens=60)
    ex.submit(2, [4, 5, 6, 4, 5], [6, 4, 5] * 40, max_new_tokens=100)
    ex.run()
    drafter.prepare_draft_tokens(stub.ScheduledRequests())  # the call after the last step
    assert calls[1] == 1 and calls[2] == 1  # request 1 was freed once, when it finished
    assert drafter.policy.finished.count(1) == 1

    drafter = make(trtllm, proposer="suffix_tree")
    calls = count_finishes(drafter)
    held_out = range(5, 7 + drafter.stale_steps)  # absent longer: swept, then restarted from its context
    ex = stub.StubExecutor(drafter, max_batch_size=2,
                           unschedule=lambda step, req: req.py_request_id == 1 and step in held_out)
    ex.submit(1, [1, 2, 3, 1, 2], [3, 1, 2] * 30, max_new_tokens=60)
    ex.submit(2, [4, 5, 6, 4, 5], [6, 4, 5] * 40, max_new_tokens=100)
    base = stub.StubExecutor(None, max_batch_size=2)
    base.submit(1, [1, 2, 3, 1, 2], [3, 1, 2] * 30, max_new_tokens=60)
    base.submit(2, [4, 5, 6, 4, 5], [6, 4, 5] * 40, max_new_tokens=100)
    ex.run()
    base.run()
    drafter.prepare_draft_tokens(stub.ScheduledRequests())
    assert calls[1] == 2  # stale sweep, then the real end
    assert outputs(ex) == outputs(base)


def test_reused_request_id_starts_clean(trtllm):
    drafter = make(trtllm, proposer="suffix_tree", policy="trtllm-test-recording",
                   proposer_options={"max_cached_requests": 0})
    calls = count_finishes(drafter)
    ex = stub.StubExecutor(drafter, max_batch_size=1)
    ex.submit(7, [1, 2, 3, 4, 1, 2, 3], [4, 1, 2, 3] * 10, max_new_tokens=20)
    ex.submit(7, [9, 8, 9, 8], [9, 8] * 20, max_new_tokens=20, arrival=1)  # same id, another request
    first_done = []
    ex.run(between_steps=lambda e: first_done.append(e.step_count) if len(e.finished) == 1 else None)
    drafter.prepare_draft_tokens(stub.ScheduledRequests())
    assert calls[7] == 2 and drafter.policy.finished == [7, 7]
    # Drafts for the second request come from its own text only.
    second = [rec.drafts[7] for rec in ex.log if 7 in rec.drafts and rec.step > first_done[0]]
    assert second and any(second) and all(set(d) <= {8, 9} for d in second)


# ---- pickling -------------------------------------------------------------------------------------------


def drafts_per_step(ex) -> list:
    return [(rec.step, sorted(rec.drafts.items())) for rec in ex.log]


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_pickled_before_use_drafts_identically(trtllm, proposer):
    drafter = make(trtllm, proposer=proposer, draft_len_schedule={1: K, 3: 2})
    copy = pickle.loads(pickle.dumps(drafter))
    assert type(copy) is type(drafter) and copy.config == drafter.config
    assert copy._proposer is None  # rebuilt on first use
    assert drafts_per_step(run(copy)) == drafts_per_step(run(drafter))


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_pickle_round_trip_mid_run_drafts_the_same(trtllm, proposer):
    reference = run(make(trtllm, proposer=proposer, draft_len_schedule={1: K, 3: 2}))
    drafter = make(trtllm, proposer=proposer, draft_len_schedule={1: K, 3: 2})
    ex = stub.StubExecutor(drafter, max_batch_size=3)
    workload(ex, 0, 7)

    def swap(e):
        if e.step_count == 6:  # some requests are mid-generation, none has finished yet
            assert not e.finished
            e.drafter = pickle.loads(pickle.dumps(e.drafter))
            assert e.drafter.max_draft_len == drafter.max_draft_len  # the step's K survives

    ex.run(between_steps=swap)
    assert ex.drafter is not drafter
    assert drafts_per_step(ex) == drafts_per_step(reference)


def test_pickling_keeps_the_bound_model(trtllm):
    import json

    drafter = make(trtllm, proposer="ngram", policy="adaptive", policy_options={"hardware": "h200"})
    drafter.bind_model(json.loads(Path(MODEL_CONFIG).read_text()))
    assert drafter.policy.cost is not None
    copy = pickle.loads(pickle.dumps(drafter))
    assert copy.policy.cost is not None
    base = run(None)
    assert outputs(run(copy)) == outputs(base)


# ---- draft length per batch size --------------------------------------------------------------------------


def test_draft_len_for_batch_size(trtllm):
    drafter = make(trtllm, proposer="ngram", draft_len_schedule={8: 0, 1: K, 4: 2})
    assert list(drafter.draft_len_schedule) == [1, 4, 8]
    # K = 0 reaches the engine as 1 (its 1.2 executor would disable those requests for good), drafts cut to 0
    assert [drafter.get_draft_len_for_batch_size(b) for b in (1, 3, 4, 7, 8, 100)] == [K, K, 2, 2, 1, 1]
    assert drafter._step_cap == 0
    # A policy that is not fixed gets {1: K} so the executor asks it every step; fixed keeps no schedule.
    assert make(trtllm, policy="adaptive", policy_options=POLICIES["adaptive"]).draft_len_schedule == {1: K}
    assert make(trtllm).draft_len_schedule is None
    # The adaptive policy's per-step budget bounds any one request's draft, never above the schedule.
    budget = make(trtllm, policy="adaptive", draft_len_schedule={1: K, 4: 2},
                  policy_options={**POLICIES["adaptive"], "max_draft_tokens_per_step": 3})
    assert [budget.get_draft_len_for_batch_size(b) for b in (1, 5)] == [3, 2]


def test_policy_batch_cap_hook(trtllm):
    class Capped(RecordingPolicy):
        def batch_cap(self, batch_size):
            return 1 if batch_size >= 2 else 9

    register_policy("trtllm-test-capped", Capped)
    drafter = make(trtllm, policy="trtllm-test-capped")
    assert [drafter.get_draft_len_for_batch_size(b) for b in (1, 2)] == [K, 1]
    ex = run(drafter)
    assert all(len(d) <= 1 for rec in ex.log if rec.active >= 2 for d in rec.drafts.values())


class WantsZero(RecordingPolicy):
    """A policy whose batch-level limit is 0 draft tokens from 3 requests on."""

    def batch_cap(self, batch_size):
        return 0 if batch_size >= 3 else None


register_policy("trtllm-test-wants-zero", WantsZero)


@pytest.mark.parametrize("how", ["schedule", "policy"])
def test_k0_never_reaches_the_executor_and_no_request_is_disabled(trtllm, how):
    """1.2's executor disables speculation for good for every request of a K = 0 step: ours tells it 1 and
    cuts the drafts of that step to nothing, per request, so the requests speculate again afterwards."""
    if how == "schedule":
        drafter = make(trtllm, proposer="ngram", draft_len_schedule={1: K, 3: 0})
    else:
        drafter = make(trtllm, proposer="ngram", policy="trtllm-test-wants-zero")
    assert drafter.get_draft_len_for_batch_size(4) == 1 and drafter.get_draft_len_for_batch_size(1) == K
    ex = run(drafter, max_batch_size=4)
    zero = [rec for rec in ex.log if rec.active >= 3]
    assert zero and all(rec.k == 1 and rec.use_spec_decode for rec in zero)
    assert all(d == [] for rec in zero for d in rec.drafts.values())  # the policy's 0, per request
    assert not any(r.py_disable_speculative_decoding for r in ex.finished)
    in_zero_steps = {req_id for rec in zero for req_id in rec.drafts}
    later = {req_id for i, rec in enumerate(ex.log) if rec.active < 3 and any(z.step < rec.step for z in zero)
             for req_id, d in rec.drafts.items() if d}
    assert in_zero_steps & later, "requests of a K = 0 step must draft again once the batch shrinks"
    assert outputs(ex) == outputs(run(None, max_batch_size=4))


def test_max_concurrency_is_the_base_class_gate(trtllm):
    drafter = make(trtllm, proposer="ngram", max_concurrency=2)
    ex = run(drafter, max_batch_size=4)
    assert all(rec.use_spec_decode == (rec.active <= 2) for rec in ex.log)


# ---- the published 1.2 base class -----------------------------------------------------------------------

# Transcribed from tensorrt_llm/_torch/speculative/drafter.py (1.2 line): method -> (parameters with
# defaults, abstract, final). `inspect.Parameter.empty` marks a parameter without a default.
E = inspect.Parameter.empty
PUBLISHED_DRAFTER_1_2 = {
    "__init__": ([("self", E), ("max_draft_len", None), ("max_total_draft_tokens", None),
                  ("max_concurrency", None), ("draft_len_schedule", None)], False, False),
    "prepare_draft_tokens": ([("self", E), ("scheduled_requests", E), ("resource_manager", None)], True, False),
    "should_use_spec_decode": ([("self", E), ("requests", E), ("max_batch_size", E), ("max_num_tokens", E),
                                ("max_total_draft_tokens", E)], False, True),
    "pad_draft_tokens_for_cuda_graph": ([("self", E), ("scheduled_requests", E)], False, True),
    "get_draft_len_for_batch_size": ([("self", E), ("batch_size", E)], False, False),
    "update_max_total_draft_tokens": ([("self", E), ("new_max_total_draft_tokens", E)], False, False),
    "run_drafter_post": ([("self", E), ("scheduled_requests", E), ("resource_manager", None),
                          ("is_warmup", False)], False, False),
}


def describe(cls) -> dict:
    out = {}
    for name, member in vars(cls).items():
        if not inspect.isfunction(member) or (name.startswith("_") and name != "__init__"):
            continue
        params = [(p.name, p.default) for p in inspect.signature(member).parameters.values()]
        out[name] = (params, name in cls.__abstractmethods__, getattr(member, "__final__", False))
    return out


def test_stub_matches_the_published_base_class():
    assert describe(stub.Drafter) == PUBLISHED_DRAFTER_1_2


# What the main line adds to the 1.2 `Drafter` (tests/trtllm_stub.py `MainLineDrafter`, and where it was read).
MAIN_LINE_CHANGES = {
    "pad_draft_tokens_for_cuda_graph": ([("self", E), ("scheduled_requests", E), ("resource_manager", None)],
                                        False, True),
    "cleanup_previous_draft_resources": ([("self", E)], False, False),
    "should_forward_draft_model": ([("self", E), ("scheduled_batch", E)], False, False),
    "generate_draft_tokens_with_overlap": ([("self", E), ("args", E), ("kwargs", E)], False, False),
}


def test_main_line_stub_is_the_12_base_plus_the_recorded_changes():
    assert describe(stub.MainLineDrafter) == MAIN_LINE_CHANGES
    assert stub.MainLineDrafter._needs_padding_kv_extension is False  # the base's default; ours sets it


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_our_drafter_serves_the_main_line_base_unchanged(monkeypatch, proposer):
    """Over the main line's `Drafter`: nothing abstract left, no final method or two-model hook overridden, the
    KV extension for pads asked for, and the same drafts and outputs as over 1.2's."""
    if not stub.install(monkeypatch, drafter_base=stub.MainLineDrafter):
        pytest.skip("a real TensorRT-LLM is importable: the stand-in bases are not installed")
    from spec_plugins.trtllm import drafter as module

    cls = module.drafter_class()
    assert issubclass(cls, stub.MainLineDrafter) and not cls.__abstractmethods__
    for name in MAIN_LINE_CHANGES:
        assert getattr(cls, name) is getattr(stub.MainLineDrafter, name), name
    assert cls._needs_padding_kv_extension is True
    main_line = run(cls(max_draft_len=K, proposer=proposer), seed=3)
    monkeypatch.undo()
    stub.install(monkeypatch)
    v12 = run(module.drafter_class()(max_draft_len=K, proposer=proposer), seed=3)
    assert outputs(main_line) == outputs(v12) and outputs(v12)
    assert [r.drafts for r in main_line.log] == [r.drafts for r in v12.log]
    assert any(r.drafts and any(r.drafts.values()) for r in v12.log)  # drafts were made


def test_our_class_satisfies_the_base_class(trtllm, monkeypatch):
    from tensorrt_llm._torch.speculative.drafter import Drafter

    cls = trtllm.drafter_class()
    assert issubclass(cls, Drafter) and not cls.__abstractmethods__
    assert cls.__name__ == "SpecPluginsDrafter" and cls.__module__ == "spec_plugins.trtllm.drafter"
    assert cls._needs_padding_kv_extension is True
    for name, (_, _, final) in PUBLISHED_DRAFTER_1_2.items():
        if final:
            assert getattr(cls, name) is getattr(Drafter, name), f"{name} is @final"
    # The constructor hands the base exactly the arguments its published signature takes.
    seen = {}
    original = Drafter.__init__

    def spy(self, *args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Drafter, "__init__", spy)
    drafter = cls(max_draft_len=3, draft_len_schedule={1: 3, 4: 1}, max_concurrency=8)
    inspect.signature(original).bind(drafter, *seen["args"], **seen["kwargs"])
    assert seen["kwargs"] == {"max_draft_len": 3, "max_total_draft_tokens": 3, "max_concurrency": 8,
                              "draft_len_schedule": {1: 3, 4: 1}}
    assert drafter._static_max_total_draft_tokens == 3


def test_exports(trtllm):
    import spec_plugins.trtllm as package

    assert package.SpecPluginsDrafter is trtllm.drafter_class()
    assert package.SpecPluginsResourceManager is trtllm.resource_manager_class()
    drafter = package.SpecPluginsDrafter(4, proposer="ngram")
    rm = package.SpecPluginsResourceManager(drafter)
    assert rm.get_needed_resource_to_completion(None) == 0 and rm.get_max_resource_count() > 0


# ---- same drafts as the vLLM adapter ------------------------------------------------------------------------


def vllm_config(proposer: str):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=10_000),
        additional_config={"spec_plugins": {"proposer": proposer}},
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(proposer=st.sampled_from(PROPOSERS),
       histories=st.lists(st.lists(st.integers(1, 6), min_size=4, max_size=40), min_size=1, max_size=4),
       growth=st.lists(st.integers(1, K + 1), min_size=1, max_size=8))
def test_same_drafts_as_the_vllm_adapter(trtllm, proposer, histories, growth):
    from spec_plugins.vllm import SpecPluginsProposer

    vllm = SpecPluginsProposer(vllm_config(proposer))
    vllm.row_req_ids = list(range(len(histories)))
    ours = make(trtllm, proposer=proposer)
    requests = [stub.LlmRequest(i, h[:3], max_new_tokens=10_000) for i, h in enumerate(histories)]
    for req in requests:
        req.state = stub.LlmRequestState.GENERATION_IN_PROGRESS
    lengths = [3] * len(histories)
    for step, grow in enumerate(growth):
        sampled = []
        for i, (req, history) in enumerate(zip(requests, histories)):
            new = history[lengths[i]: lengths[i] + grow] or [history[-1]]
            for t in new:
                req.add_new_token(t, 0)
            lengths[i] += grow
            sampled.append(new)
        rows = [req.get_tokens(0) for req in requests]
        token_ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
        for i, row in enumerate(rows):
            token_ids[i, : len(row)] = row
        expected = vllm.propose(sampled, np.array([len(r) for r in rows]), token_ids)
        batch = stub.ScheduledRequests()
        batch.generation_requests = list(requests)
        ours.prepare_draft_tokens(batch)
        assert [req.py_draft_tokens for req in requests] == expected


# ---- bad input and a missing TensorRT-LLM ------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"draft_len_schedule": {1: 3}}, r"^draft_len_schedule: must map batch size 1 to max_draft_len \(4\), got 3$"),
    ({"draft_len_schedule": {2: 4}}, r"^draft_len_schedule: must map batch size 1 to max_draft_len"),
    ({"draft_len_schedule": {1: 4, 4: 5}}, r"^draft_len_schedule\[4\]: 5 exceeds max_draft_len 4$"),
    ({"draft_len_schedule": [1, 4]}, r"^draft_len_schedule: expected a dict"),
    ({"proposer": "nope"}, r"^proposer: unknown name 'nope'; expected one of: "),
    ({"proposer": "ngram", "proposer_options": {"max_ngram": "x"}},
     r"^proposer_options\[ngram\]\.max_ngram: Input should be a valid integer"),
    ({"proposer": "suffix_tree", "proposer_options": {"max_depht": 3}},
     r"^proposer_options\[suffix_tree\]\.max_depht: unknown option"),
    ({"proposer_options": [1]}, r"^proposer_options: expected a dict"),
    ({"policy": "nope"}, r"^policy: unknown name 'nope'"),
    ({"policy_options": {"bogus": 1}}, r"^policy_options\.bogus: unknown option"),
    ({"max_draft_len": 0}, r"^max_draft_len: expected an integer >= 1, got 0$"),
    ({"max_draft_len": "4"}, r"^max_draft_len: expected an integer, got '4'$"),
    ({"max_concurrency": 0}, r"^max_concurrency: expected an integer >= 1, got 0$"),
])
def test_bad_input_is_one_line_value_error_naming_the_field(trtllm, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        make(trtllm, **kwargs)
    assert "\n" not in str(info.value)


def test_without_tensorrt_llm_building_a_drafter_says_what_is_missing():
    if stub.trtllm_installed():
        pytest.skip("TensorRT-LLM is installed here")
    from spec_plugins.trtllm import drafter

    with pytest.raises(ImportError, match=r"^spec_plugins\.trtllm needs TensorRT-LLM >= 1\.2 .*"
                                          r"importing tensorrt_llm\._torch\.speculative\.drafter failed") as info:
        drafter.drafter_class()
    assert "\n" not in str(info.value)
    with pytest.raises(ImportError, match="needs TensorRT-LLM"):
        import spec_plugins.trtllm as package

        package.SpecPluginsDrafter(max_draft_len=K)


def test_import_does_not_pull_in_tensorrt_llm():
    code = ("import sys, spec_plugins, spec_plugins.trtllm, spec_plugins.trtllm.drafter; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorrt_llm', 'torch', 'vllm')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_suffix_tree_appends_ahead_beside_the_gpu(trtllm):
    """TensorRT-LLM's forward always runs on the GPU: `append_ahead: auto` is on there, and the lossless runs
    above (suffix tree cells) run with it."""
    drafter = make(trtllm, proposer="suffix_tree")
    run(drafter)
    assert drafter._drafting.proposer.appends_ahead
