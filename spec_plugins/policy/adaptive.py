"""`adaptive`: per request, per step, the draft length that maximises expected tokens per second.

    --additional-config '{"spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive",
                          "policy_options": {"profile": "configs/profiles/vllm-cpu-smollm2-135m.json"}}}'
    # or a modelled GPU: {"hardware": "h200"} (+ "model_config": PATH; vLLM passes its own model)

Each step the proposer drafts up to the engine's K; `trim` then keeps, for every request, the prefix
that maximises Theta = expected tokens / modelled step time over the whole batch (`allocator.py`),
from survival estimates (`acceptance.py`):

* drafts with per-token confidences (suffix tree, DSpark): the confidences, calibrated online against
  what verification accepted;
* drafts without: each request's own acceptance history per position, shrunk to the pooled history.

A request whose draft is empty costs nothing extra. Drafts sampled from a draft distribution
(`Draft.probs` set) are trimmed with the non-anticipating greedy search, deterministic drafts with the
global one (see allocator.py). For sampled drafts a proposer's confidence at position j may depend on the
tokens before j but never on token j itself (DSpark's head sees x_{j-1}, not x_j): keeping a sampled
token because of its own value biases the output (a chi-square test in tests/test_reference.py).
"""

from __future__ import annotations

from typing import Any, Hashable, Literal, Sequence

import numpy as np
import pydantic

from spec_plugins.core import Draft, DraftRequest
from spec_plugins.policy.acceptance import ConfidenceCalibrator, HistoryEstimator, survival
from spec_plugins.policy.allocator import StepCost, allocate
from spec_plugins.policy.cost import step_cost


class AdaptiveLength:
    """Goodput-optimal draft lengths from a step-cost model and live acceptance estimates."""

    name = "adaptive"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())
        hardware: str | None = None  # GPU profile name (h200, ...) or a YAML path
        model_config_path: str | None = pydantic.Field(default=None, alias="model_config")
        profile: str | None = None  # measured step-time profile (`spec-plugins profile`)
        dtype: Literal["bf16", "fp8"] = "bf16"
        draft_us_per_request: float = pydantic.Field(default=5.0, ge=0.0)
        confidence: Literal["auto", "off"] = "auto"
        search: Literal["auto", "global", "greedy"] = "auto"
        min_gain: float = pydantic.Field(default=0.0, ge=0.0, le=1.0)
        history_decay: float = pydantic.Field(default=0.9, gt=0.0, le=1.0)
        max_positions: int = pydantic.Field(default=64, ge=1, le=4096)
        objective: Literal["long_run", "per_step"] = "long_run"
        rate_decay: float = pydantic.Field(default=0.98, gt=0.0, lt=1.0)
        request_correction: float = pydantic.Field(default=8.0, ge=0.0)  # pseudo-trials; 0 = off
        max_draft_tokens_per_step: int | None = pydantic.Field(default=None, ge=0)  # over the whole batch

    def __init__(self, *, cost: StepCost | None = None, **options: Any) -> None:
        opts = self.Options(**options)
        self.options = opts
        self.cost = cost
        self.history = HistoryEstimator(opts.max_positions, decay=opts.history_decay)
        self.calibrator = ConfidenceCalibrator()
        # What was kept of each request's last draft, to learn from when its verification comes back.
        self._kept_confidence: dict[Hashable, list[float] | None] = {}
        self._request_fit: dict[Hashable, tuple[float, float]] = {}  # decayed (accepted, predicted)
        self._tau = self._time = 0.0  # decayed sums of expected tokens and modelled seconds per step
        if self.cost is None and (opts.hardware is None) == (opts.profile is None):
            raise ValueError("policy_options: expected exactly one of 'hardware' (a GPU profile) or 'profile' "
                             "(a measured step-time profile)")
        if self.cost is None and opts.profile is not None:
            self.cost = step_cost(profile=opts.profile, draft_us_per_request=opts.draft_us_per_request)
        if self.cost is None and opts.model_config_path is not None:
            from spec_plugins.policy.model import load_model_config

            self.bind_model(load_model_config(opts.model_config_path))

    def bind_model(self, model: Any, source: str = "engine model config") -> None:
        """Cost `model` (a ModelDescriptor, or a Hugging Face config dict) on the options' hardware,
        unless a cost model is already set.

        Engines call this with their own model's config, so `hardware` alone is enough in the options.
        """
        if self.cost is not None:
            return
        from spec_plugins.policy.model import ModelDescriptor

        if isinstance(model, dict):
            model = ModelDescriptor.from_config(model, source=source)
        self.cost = step_cost(hardware=self.options.hardware, model=model, dtype=self.options.dtype,
                              draft_us_per_request=self.options.draft_us_per_request)

    # ---- DraftLengthPolicy ----------------------------------------------------------------------

    def caps(self, requests: Sequence[DraftRequest]) -> list[int]:
        # Draft up to the engine's cap; `trim` chooses once the drafts (and their confidences) exist.
        return [r.max_draft for r in requests]

    def trim(self, requests: Sequence[DraftRequest], drafts: Sequence[Draft]) -> list[int]:
        if self.cost is None:
            raise ValueError("policy 'adaptive': no cost model; give policy_options.model_config or let the "
                             "engine bind its model")
        surv = [self.survival(req.req_id, d) for req, d in zip(requests, drafts)]
        search = self.options.search
        if search == "auto":
            search = "greedy" if any(d.probs is not None for d in drafts) else "global"
        context = [len(r.tokens) for r in requests]
        drafted = [len(d) for d in drafts]
        lengths = allocate(surv, context, self.cost, search=search, drafted=drafted,
                           min_gain=self.options.min_gain, rate=self._rate(),
                           budget=self.options.max_draft_tokens_per_step)
        # The long-run goodput the allocator weighs tokens against: modelled, over recent steps.
        d = self.options.rate_decay
        self._tau = d * self._tau + sum(1.0 + float(np.sum(s[:n])) for s, n in zip(surv, lengths))
        self._time = d * self._time + self.cost.step_time(lengths, context)
        for req, d, n in zip(requests, drafts, lengths):
            conf = self._usable(d)
            self._kept_confidence[req.req_id] = None if conf is None else conf[:n]
        return lengths

    def _rate(self) -> float | None:
        if self.options.objective == "per_step" or self._time <= 0.0:
            return None
        return self._tau / self._time

    def survival(self, req_id: Hashable, draft: Draft) -> np.ndarray:
        """Prefix survival of each drafted position of `draft`."""
        n = min(len(draft), self.options.max_positions)
        conf = self._usable(draft)
        if conf is not None:
            cond = self.calibrator.calibrate(conf[:n])
            if self.options.request_correction > 0:
                cond = np.clip(cond * self._correction(req_id), 0.0, 1.0)
        else:
            cond = self.history.conditional(req_id)[:n]
        return survival(cond)

    def _correction(self, req_id: Hashable) -> float:
        # How this request's drafts fared against the calibrated prediction (requests differ: one copies
        # a file, another writes new text); k pseudo-trials keep a new request at factor 1.
        k = self.options.request_correction
        ok, predicted = self._request_fit.get(req_id, (0.0, 0.0))
        return (ok + k) / (predicted + k)

    def observe(self, req_id: Hashable, drafted: int, accepted: int) -> None:
        self.history.observe(req_id, drafted, accepted)
        conf = self._kept_confidence.pop(req_id, None)
        if conf is not None and len(conf) == drafted and drafted > 0:
            tried = min(accepted + 1, drafted)
            predicted = float(np.sum(self.calibrator.calibrate(conf[:tried])))
            ok, pred = self._request_fit.get(req_id, (0.0, 0.0))
            d = self.options.history_decay
            self._request_fit[req_id] = (d * ok + accepted, d * pred + predicted)
            self.calibrator.observe(conf, accepted)

    def finish(self, req_id: Hashable) -> None:
        self.history.finish(req_id)
        self._kept_confidence.pop(req_id, None)
        self._request_fit.pop(req_id, None)

    def _usable(self, draft: Draft) -> list[float] | None:
        if self.options.confidence == "off" or draft.confidence is None:
            return None
        return list(draft.confidence)
