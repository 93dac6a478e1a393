"""`adaptive`: per request, per step, the draft length that maximises expected tokens per second.

    --additional-config '{"spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive"}}'
    # the same, a GPU named: "policy_options": {"hardware": "h200"}; a measured step-time profile:
    # "policy_options": {"profile": "configs/profiles/vllm-cpu-smollm2-135m.json"}

With no options the cost prior comes from the engine (`policy/device.py`): the GPU it runs on picks a shipped
hardware profile (or a roofline from the GPU's reported properties), costed on the model the engine serves; a
CPU engine starts from the measured CPU profile. The engine's measured step times then correct that prior
online (`step_overhead: measured`, below). Explicit options win.

Each step the proposer drafts up to the engine's K; `trim` then keeps, for every request, the prefix
that maximises Theta = expected tokens / modelled step time over the whole batch (`allocator.py`),
from survival estimates (`acceptance.py`):

* drafts with per-token confidences (suffix tree, DSpark): the confidences, calibrated online against
  what verification accepted;
* drafts without: each request's own acceptance history per position, shrunk to the pooled history.

A request whose draft is empty costs nothing extra. With `step_overhead: measured` (the default), where the
engine reports its measured step intervals (`observe_step_interval`), each step also pays the time they show
beyond the cost model (`StepTimeFit`: an offset, told apart from a machine uniformly slower than its profile): a
prior from another setting (a datasheet roofline, a profile of a bare forward or of another model, an engine
in-process against `vllm serve` with its scheduler, sampler and front end per step) would otherwise misprice
verified tokens against the real step. Where drafting has stopped, the steps no longer tell a slope from an
offset, and the fit keeps the slope it last measured (so it neither drifts nor restarts drafting by itself).

Where no draft pays for the drafting step itself (a compute-bound batch whose drafts are rarely accepted: each
verified token costs about what it returns, and the proposer's search and appends are host time the step waits
for), the policy pauses drafting (`DraftingPause`): the drafting layer then runs neither the proposer nor the trim,
and hands the proposer what the requests appended at the next step that drafts. Pauses double while the probes
that end them find drafting still does not pay.

Drafts sampled from a draft distribution
(`Draft.probs` set) are trimmed with the non-anticipating greedy search, deterministic drafts with the
global one (see allocator.py). For sampled drafts a proposer's confidence at position j may depend on the
tokens before j but never on token j itself (DSpark's head sees x_{j-1}, not x_j): keeping a sampled
token because of its own value biases the output (a chi-square test in tests/test_reference.py).
"""

from __future__ import annotations

import logging
from typing import Any, Hashable, Literal, Sequence

import numpy as np
import pydantic

from spec_plugins.core import BatchDrafts, Draft, DraftBatch, DraftRequest
from spec_plugins.policy.acceptance import ConfidenceCalibrator, HistoryEstimator, _observe
from spec_plugins.policy.allocator import StepCost, _trim, curve_source
from spec_plugins.policy.cost import step_cost
from spec_plugins.slots import RequestSlots


class AdaptiveLength:
    """Goodput-optimal draft lengths from a step-cost model and live acceptance estimates.

    The batched methods (`caps_batch`, `trim_batch`, `observe_batch`; what the drafting layer calls)
    work on the whole step as arrays; the per-request ones (`caps`, `trim`, `observe`) are the same
    computation on a batch built from their arguments.
    """

    name = "adaptive"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())
        hardware: str | None = None  # GPU profile name (h200, ...) or a YAML path; default: the engine's device
        # the target's config.json (or its folder); vLLM binds the model it serves
        model_config_path: str | None = pydantic.Field(default=None, alias="model_config")
        profile: str | None = None  # measured step-time profile (`spec-plugins profile`) instead of hardware
        dtype: Literal["bf16", "fp8"] = "bf16"  # weight / GEMM dtype of the roofline
        draft_us_per_request: float = pydantic.Field(default=5.0, ge=0.0)  # model-free drafting cost per request, µs
        confidence: Literal["auto", "off"] = "auto"  # off: acceptance history only, the drafts' confidences ignored
        # greedy: the non-anticipating search (sampled drafts); global: the best prefixes over the whole step;
        # auto: global for deterministic drafts, greedy where drafts carry a draft distribution
        search: Literal["auto", "global", "greedy"] = "auto"
        min_gain: float = pydantic.Field(default=0.0, ge=0.0, le=1.0)  # a longer allocation must win by this margin
        history_decay: float = pydantic.Field(default=0.9, gt=0.0, le=1.0)  # per-observation decay of the history
        max_positions: int = pydantic.Field(default=64, ge=1, le=4096)  # draft positions the estimates keep
        objective: Literal["long_run", "per_step"] = "long_run"  # the running goodput, or each step's own
        rate_decay: float = pydantic.Field(default=0.98, gt=0.0, lt=1.0)  # per-step decay of the running goodput
        request_correction: float = pydantic.Field(default=8.0, ge=0.0)  # pseudo-trials; 0 = off
        max_draft_tokens_per_step: int | None = pydantic.Field(default=None, ge=0)  # over the whole batch
        # "measured": the cost model corrected by the engine's measured steps (where the engine reports step
        # intervals; StepTimeFit), so a prior (a datasheet, another model's profile) is fitted to the engine
        # it serves. "model": the cost model alone.
        step_overhead: Literal["measured", "model"] = "measured"
        overhead_decay: float = pydantic.Field(default=0.95, gt=0.0, lt=1.0)  # per-step decay of the overhead fit
        # A negative fitted offset (verified tokens dearer than the profile says) takes at most this fraction
        # of the step's modelled base time (no drafts) off the sunk time; 0: the offset never goes below 0.
        max_offset_cut: float = pydantic.Field(default=0.9, ge=0.0, lt=1.0)

        # Names are resolved here, so a bad one is reported under its field (policy_options.hardware: ...)
        # when the engine starts, not when the first step costs a draft. The resolvers' own messages name
        # the field already; the prefix goes, pydantic adds the path.
        @pydantic.field_validator("hardware", "profile")
        @classmethod
        def _known_name(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
            if value is not None:
                from spec_plugins.policy.hardware import load_hardware
                from spec_plugins.policy.measured import profile_path

                resolve, prefix = {"hardware": (load_hardware, "hardware: "),
                                   "profile": (profile_path, "policy_options.profile: ")}[info.field_name]
                try:
                    resolve(value)
                except ValueError as exc:
                    raise ValueError(str(exc).removeprefix(prefix)) from None
            return value

    def __init__(self, *, cost: StepCost | None = None, **options: Any) -> None:
        opts = self.Options(**options)
        self.options = opts
        self.cost = cost
        p = opts.max_positions
        # Per request, one slot for all of its state: the raw confidences kept of its last draft (kept_len
        # -1: none), to learn from when its verification comes back, its decayed (accepted, predicted)
        # fit, and its acceptance history.
        self.requests = RequestSlots(kept=((p,), np.float64, 0.0), kept_len=((), np.int64, -1),
                                     fit_ok=((), np.float64, 0.0), fit_predicted=((), np.float64, 0.0),
                                     **HistoryEstimator.columns(p))
        self.history = HistoryEstimator(p, decay=opts.history_decay, slots=self.requests)
        self.calibrator = ConfidenceCalibrator()
        self._tau = self._time = 0.0  # decayed sums of expected tokens and modelled seconds per step
        # The engine's measured steps against the modelled ones; _modelled is the last trimmed step's modelled
        # time (None: no step to compare the next interval with), _bare its modelled time with no drafts.
        self.step_fit = StepTimeFit(opts.overhead_decay)
        self.observes_step_time = opts.step_overhead == "measured"  # core.ObservesStepTime
        self._modelled: float | None = None
        self._bare = 0.0
        self._last_modelled = self._last_tau = 0.0  # the last trimmed step's modelled seconds and expected tokens
        self.pause = DraftingPause(opts.rate_decay)  # drafting paused where it does not pay (core.PausesDrafting)
        self._curves_of: StepCost | None = None  # the cost model `_curves` reads (allocator.curve_source)
        self._curves = None
        # Where the cost model came from (the engine's log names it); with no options, the prior is chosen from
        # the engine's device when the first step is costed (_engine: (model, device) the engine bound).
        self.cost_source = "given" if cost is not None else ""
        self._engine: tuple[Any, str | None] | None = None
        if self.cost is None and opts.hardware is not None and opts.profile is not None:
            raise ValueError("policy_options: expected at most one of 'hardware' (a GPU profile) or 'profile' "
                             "(a measured step-time profile), got both")
        if self.cost is None and opts.profile is not None:
            self.cost = step_cost(profile=opts.profile, draft_us_per_request=opts.draft_us_per_request)
            self.cost_source = f"profile {opts.profile!r}"
        if self.cost is None and opts.model_config_path is not None:
            from spec_plugins.policy.model import load_model_config

            self.bind_model(load_model_config(opts.model_config_path))

    def bind_model(self, model: Any, source: str = "engine model config", device: str | None = None) -> None:
        """The engine's model (a ModelDescriptor, or a Hugging Face config dict) and device type ("cuda", "cpu";
        None: read from torch where the first step is costed).

        With `hardware`, the model is costed on it now; with `profile`, the profile is checked to be of this
        model's shape; with neither, the prior is chosen from the device when the first step is costed
        (`policy/device.py`: reading the GPU initialises CUDA, which an engine's front-end process must not).
        """
        from spec_plugins.policy.model import ModelDescriptor

        if self.options.profile is not None and isinstance(model, dict):
            from spec_plugins.policy.measured import check_profile_model

            check_profile_model(getattr(self.cost, "profile", {}), model)
        if self.cost is not None:
            return
        if isinstance(model, dict):
            model = ModelDescriptor.from_config(model, source=source)
        if self.options.hardware is None:
            if self._engine is not None and self.options.model_config_path is not None:
                model = self._engine[0]  # the options' model_config wins over the engine's model
            self._engine = (model, device)
            return
        self.cost = step_cost(hardware=self.options.hardware, model=model, dtype=self.options.dtype,
                              draft_us_per_request=self.options.draft_us_per_request)
        self.cost_source = f"hardware {self.options.hardware!r}"

    def resolve_cost(self) -> None:
        """Settle the cost model now (core.ResolvesCost), not at the first step."""
        if self.cost is None:
            self._cost_from_engine()

    def _cost_from_engine(self) -> None:
        """The cost prior of the engine's device (no hardware or profile given): `policy/device.py`."""
        from spec_plugins.policy.device import prior_for_device

        model, device = self._engine if self._engine is not None else (None, None)
        kind, prior, how = prior_for_device(device)
        o = self.options
        if kind == "profile":
            self.cost = step_cost(profile=prior, draft_us_per_request=o.draft_us_per_request)
        elif model is None:
            raise ValueError("policy 'adaptive': no cost model; give policy_options.model_config or let the "
                             "engine bind its model")
        else:
            self.cost = step_cost(hardware=prior, model=model, dtype=o.dtype,
                                  draft_us_per_request=o.draft_us_per_request)
        self.cost_source = f"prior from the engine's device: {how}"
        logging.getLogger("spec_plugins").info("spec-plugins: policy 'adaptive' costs steps with the %s%s",
                                               self.cost_source, ", corrected online by the measured steps"
                                               if self.observes_step_time else "")

    # ---- batched (BatchPolicy) ----------------------------------------------------------------------

    def caps_batch(self, batch: DraftBatch) -> np.ndarray:
        # Draft up to the engine's cap; `trim_batch` chooses once the drafts (and their confidences) exist.
        return batch.max_draft

    def trim_batch(self, batch: DraftBatch, drafts: BatchDrafts) -> np.ndarray:
        return self._trim_batch(batch, drafts, None)

    def trim_rated(self, batch: DraftBatch, drafts: BatchDrafts) -> tuple[np.ndarray, np.ndarray]:
        """`trim_batch`, and each drafted token's calibrated conditional acceptance estimate (core.RatesDrafts; flat,
        in the layout of `drafts`; 0 past `max_positions`) read off the survival the trim itself computed: on the
        kept prefixes, what `survival_batch` then `BatchDrafts.with_survival` give the kept drafts, in the same
        compiled call."""
        conditional = np.empty(len(drafts.tokens))
        return self._trim_batch(batch, drafts, conditional), conditional

    def _trim_batch(self, batch: DraftBatch, drafts: BatchDrafts, conditional: np.ndarray | None) -> np.ndarray:
        if self.cost is None:
            self._cost_from_engine()
        drafted = drafts.lengths
        slots = self.requests.slots_of(batch.req_ids)
        search = self.options.search
        if search == "auto":
            search = "global" if drafts.probs is None or all(p is None for p in drafts.probs) else "greedy"
        context = batch.context_lens
        n = len(drafted)
        tokens = len(drafts.tokens)  # bounds the longest draft without reading the lengths
        curves = self._curve_source()(n, n + tokens + 1, context, min(tokens, self.options.max_positions))
        # The fitted offset, bounded below by max_offset_cut of the step with no drafts where it is negative, read at
        # the last step's base time: the batch and its contexts change little from one step to the next.
        lengths, tau, step, extra, bare = self._trim_step(slots, drafts, search, context, curves,
                                                          self.step_fit.offset(-np.inf, self._bare), conditional)
        self._bare = bare
        pause = self.pause
        sample = pause.sample
        if sample is None:
            # The long-run goodput the allocator weighs tokens against: modelled, over recent steps.
            d = self.options.rate_decay
            self._tau = d * self._tau + tau
            self._last_tau = tau
            self._modelled = self._last_modelled = step
            self._time = d * self._time + step + extra
        else:
            # A probe of a sample: the step was costed as if every request drafted as one of the sample (what drafting
            # is weighed on), and only the sample's drafts are kept; the engine verifies those alone, so the costing
            # is neither a step to fit nor one of the running goodput, and no other request has a draft to learn from.
            self._modelled = None
            waits = np.ones(n, dtype=bool)
            waits[sample] = False
            lengths[waits] = 0
            self.requests.columns["kept_len"][slots[waits]] = -1
        # Drafting at all against the same step with no drafter: the drafting step's host time is what a pause saves.
        # The fitted offset holds it where the engine's measured steps are fitted (they include it); else it is added.
        on, off, host = step + extra, bare + extra, pause.host_s
        fit = self.step_fit
        if self.observes_step_time and fit.fitted:
            per_step, host = extra, host / fit.slope()  # measured seconds in modelled ones
            # Steps all alike (drafting steps at a steady load) cannot tell time every step pays (an engine's own host
            # time) from a slope, and the fit reads it as a slope: drafting would look as dear as the model makes it.
            # Weighed here as every step's: a wrong pause loses what drafting wins for a whole pause, while the
            # drafting it keeps costs its host time a step, and a step whose trim keeps nothing still pauses.
            unexplained = fit.unexplained()
            if unexplained is not None and unexplained > per_step:
                per_step, host = unexplained, pause.host_s
            on, off = step + per_step, bare + per_step - host
        elif host > 0.0:
            on += host
        pause.weigh(n, tau, on, off)
        return lengths

    def _curve_source(self):
        """allocator.curve_source of the current cost model, resolved once per cost model."""
        if self._curves_of is not self.cost:
            self._curves_of, self._curves = self.cost, curve_source(self.cost)
        return self._curves

    @property
    def measured_overhead_s(self) -> float:
        """Seconds (in the cost model's time) every step pays beyond the model, fitted on the engine's measured
        steps (StepTimeFit); 0 until measured, or with `step_overhead: model`. Negative where verified tokens
        are dearer against the base step than modelled (`trim_batch` bounds it by `max_offset_cut`)."""
        return self.step_fit.offset(-np.inf, self._bare)

    def stats(self) -> dict[str, float]:
        """What the policy believes of the engine's steps (core.HasStats; the vLLM adapter's trace): the fitted
        slope and offset of measured against modelled steps, the long-run tokens per modelled second, and the last
        trimmed step's modelled time and expected tokens (to set beside what the engine measured and accepted)."""
        rate = self._rate()
        return {"step_fits": self.step_fit.w, "step_slope": self.step_fit.slope(),
                "step_offset_ms": self.measured_overhead_s * 1e3, "tokens_per_s": 0.0 if rate is None else rate,
                "modelled_ms": self._last_modelled * 1e3, "expected_tokens": float(self._last_tau)}

    def drafting_rows(self, batch_size: int) -> np.ndarray | None:
        """None (every request drafts), no rows while drafting is paused, a sample on a probe (core.PausesDrafting;
        DraftingPause)."""
        pause = self.pause
        if pause.left <= 0 and not pause._probe:  # the usual step first: two attribute reads
            return None
        return pause.rows(batch_size)

    def observe_drafting_seconds(self, seconds: float) -> None:
        """The host seconds of the last step's drafting (proposer and trim), where the engine keeps time and the step
        handed the proposer no backlog."""
        self.pause.observe_host(seconds)

    def observe_step_interval(self, seconds: float) -> None:
        """The engine's whole step that verified the last trimmed drafts took `seconds` (core.ObservesStepTime)."""
        modelled, self._modelled = self._modelled, None  # each trimmed step is compared once
        if not self.observes_step_time or modelled is None or not seconds > 0.0 or not modelled > 0.0:
            return
        self.step_fit.add(modelled, seconds, self._bare)

    def _trim_step(self, slots: np.ndarray, drafts: BatchDrafts, search: str, context: np.ndarray,
                   curves: tuple, extra: float, conditional: np.ndarray | None = None) -> tuple:
        """Survival, walk and bookkeeping in one compiled call (policy/_trim.cpp): (lengths, expected tokens,
        modelled seconds, the offset `extra` as bounded by max_offset_cut, the modelled seconds of the same step with
        no drafts) of the step, each request's kept confidences stored, and `conditional` (where given) filled with
        each drafted token's conditional estimate (tests/policy_reference.py: the same step in numpy)."""
        cols, cal, o = self.requests.columns, self.calibrator, self.options
        with_conf = o.confidence != "off" and drafts.confidence is not None
        h = self.history
        history = None if with_conf else (h.pooled_trials, h.pooled_successes, h.pooled_prior, h.pooled_prior_weight,
                                          cols["trials"], cols["successes"], h.request_prior_weight)
        curve, terms = curves
        # Positional, in the binding's order (its names beside each): pybind11 matches keywords one by one, which for
        # these 24 costs 1.6 us a step, half the whole policy's host time at B = 1.
        lengths, tau, linear, attention, extra, bare = _trim.trim_step(
            drafts.confidence if with_conf else None, drafts.offsets, drafts.lengths,  # conf, offsets, drafted
            history, slots, cal.trials, cal.successes, cal.prior_weight,  # history, slots, cal_*, prior_weight
            cols["fit_ok"], cols["fit_predicted"], o.request_correction,  # fit_ok, fit_predicted, correction_k
            cols["kept"], cols["kept_len"],  # kept, kept_len
            self.cost.overhead_s, self.cost.draft_time(drafts.lengths), extra, o.max_offset_cut,  # overhead,
            search == "greedy", o.min_gain, self._rate(),  # draft_seconds, offset, offset_cut; greedy, min_gain, rate
            -1 if o.max_draft_tokens_per_step is None else o.max_draft_tokens_per_step,  # budget
            curve, terms, conditional)  # curve, attention, conditional
        # step_time's sum, from the parts the walk read off the same curves
        overhead = self.cost.overhead_s
        return lengths, tau, overhead + linear + attention + self.cost.draft_time(lengths), extra, overhead + bare

    def survival_batch(self, req_ids: Sequence[Hashable], drafts: BatchDrafts
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(prefix survival [n, K], usable lengths [n], raw confidences [n, K] or None) of a step's drafts:
        calibrated confidences where the drafts carry them, else each request's acceptance history."""
        return self._survival(req_ids, self.requests.lookup(req_ids, create=False)[0], drafts)

    def _survival(self, req_ids: Sequence[Hashable], slots: np.ndarray, drafts: BatchDrafts
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        p = self.options.max_positions
        usable = np.minimum(drafts.lengths, p)
        width = int(usable.max()) if len(usable) else 0
        if self.options.confidence != "off" and drafts.confidence is not None:
            # calibration, correction and products along each draft in one compiled call
            cal = self.calibrator
            correction = self._correction(slots) if self.options.request_correction > 0 else None
            surv, conf = _trim.calibrated_survival(drafts.confidence, drafts.offsets, usable, width, cal.trials,
                                                   cal.successes, cal.prior_weight, correction)
            return surv, usable, conf
        cond = self.history.conditional_batch(req_ids)[:, :width]
        return np.cumprod(np.clip(cond, 0.0, 1.0), axis=1), usable, None

    def _correction(self, slots: np.ndarray) -> np.ndarray:
        # How each request's drafts fared against the calibrated prediction (requests differ: one copies
        # a file, another writes new text); k pseudo-trials keep a new request at factor 1.
        k = self.options.request_correction
        ok = self.requests.gather("fit_ok", slots, 0.0)
        predicted = self.requests.gather("fit_predicted", slots, 0.0)
        return (ok + k) / (predicted + k)

    def observe_batch(self, req_ids: Sequence[Hashable], drafted: np.ndarray, accepted: np.ndarray) -> None:
        drafted = np.asarray(drafted, dtype=np.int64)
        accepted = np.asarray(accepted, dtype=np.int64)
        # history, calibrator and fits, one observation at a time, in one compiled call (policy/_observe.cpp)
        slots = self.requests.slots_of(req_ids)
        cols, cal, hist = self.requests.columns, self.calibrator, self.history
        # positional, in the binding's order (as `_trim_step`: keywords cost a step a microsecond)
        _observe.observe_step(slots, drafted, accepted, hist.pooled_trials, hist.pooled_successes,  # slots .. pooled_*
                              cols["trials"], cols["successes"], hist.decay, hist.pooled_decay,  # trials .. pooled_decay
                              cols["kept"], cols["kept_len"], cal.trials, cal.successes, cal.prior_weight,
                              cal.decay, cols["fit_ok"], cols["fit_predicted"], self.options.history_decay)

    # ---- per request (DraftLengthPolicy) ------------------------------------------------------------

    def caps(self, requests: Sequence[DraftRequest]) -> list[int]:
        return [r.max_draft for r in requests]

    def trim(self, requests: Sequence[DraftRequest], drafts: Sequence[Draft]) -> list[int]:
        return self.trim_batch(DraftBatch.from_requests(requests), BatchDrafts.from_drafts(drafts)).tolist()

    def survival(self, req_id: Hashable, draft: Draft) -> np.ndarray:
        """Prefix survival of each drafted position of `draft`."""
        surv, usable, _ = self.survival_batch([req_id], BatchDrafts.from_drafts([draft]))
        return surv[0, : usable[0]]

    def observe(self, req_id: Hashable, drafted: int, accepted: int) -> None:
        self.observe_batch([req_id], np.array([drafted]), np.array([accepted]))

    def finish(self, req_id: Hashable) -> None:
        self.requests.release(req_id)  # the history's columns are among these

    def batch_cap(self, batch_size: int) -> int | None:
        """`max_draft_tokens_per_step` is shared by the whole batch and spread unevenly by the allocator, so
        it bounds one request's draft by the whole budget, not by budget / batch_size."""
        return self.options.max_draft_tokens_per_step

    def _rate(self) -> float | None:
        if self.options.objective == "per_step" or self._time <= 0.0:
            return None
        return self._tau / self._time


class DraftingPause:
    """Drafting paused where drafting at all does not pay: no choice of lengths saves the drafting step's own host
    time (the proposer's search and appends, the trim), which a step with no drafter does not spend.

    Every drafting step is weighed against the same step with no drafter, both as the policy costs its steps:
    `on_s` with the kept drafts and the drafting host time, `off_s` with no drafts and without it, `tau` expected
    tokens against one a request. Over the drafting steps since the batch size last changed twofold (decayed sums,
    `min_steps` of them at least), once tau / on_s falls below n / off_s, drafting pauses for `first` steps, then
    drafts one step (a probe, weighed alone: it decides whether drafting resumes) and pauses twice as long each time
    the probe finds drafting still does not pay, up to `longest`.

    A probe drafts for a sample of `probe_requests` requests of the batch (`rows`, kept as `sample` until it is
    weighed; the next probe the next ones): a request's drafts can only be searched once the proposer has every token
    the request appended during the pause, and handing the whole batch that backlog would cost the probe several
    ordinary drafting steps (at B = 256, 128 tokens a request, 5x one). The probe's trim costs the whole step as if
    every request drafted as one of the sample did, so it is weighed at the batch's own cost (a step's cost is not
    linear in what it verifies), and keeps drafts for the sample alone. The drafting layer hands the proposer a
    request's backlog at its next step that drafts (the probe's sample at the probe, the rest at the step after it
    where drafting resumes); such a step's host time includes that catch-up, and the layer does not report it as the
    drafting step's (`observe_host`)."""

    _NO_ROWS = np.zeros(0, dtype=np.int64)

    def __init__(self, decay: float, min_steps: int = 8, first: int = 8, longest: int = 256,
                 probe_requests: int = 16) -> None:
        self.decay, self.min_steps, self.first, self.longest = decay, min_steps, first, longest
        self.probe_requests = probe_requests
        self.host_s = 0.0  # the drafting step's host seconds, as last measured (0: no clock)
        self.left = 0  # steps left in the current pause
        self.length = first  # the next pause's length
        self.sample: np.ndarray | None = None  # the rows a probe drafts for, until it is weighed (None: every row)
        self._next_row = 0  # where the next probe's sample starts: probes go round the batch
        self._probe = False  # the next drafting step ends a pause
        self._reset(0)

    def _reset(self, batch: int) -> None:
        self.batch, self.steps = batch, 0
        self.requests = self.tokens = self.on_s = self.off_s = 0.0  # decayed sums over drafting steps

    def rows(self, n: int) -> np.ndarray | None:
        """The rows of a step of n requests that draft (core.PausesDrafting.drafting_rows): None, every one."""
        if self.left > 0:
            if self._same_load(n):
                self.left -= 1
                self._probe = self.left == 0
                return self._NO_ROWS
            # The pause was weighed at another load (a burst ending, a new one after it): drafting resumes and is
            # weighed again at this one. A pause kept across loads outlived what decided it: 256 steps decided at
            # the end of one burst of 256 requests covered the whole of the next, which drafting would have paid.
            self.left, self.length, self._probe = 0, self.first, False
            self._reset(n)
        k = self.probe_requests
        if not self._probe or n <= k:
            return None
        start = self._next_row % n
        self._next_row = start + k
        self.sample = np.sort((start + np.arange(k)) % n)
        return self.sample

    def _same_load(self, n: int) -> bool:
        """n requests are the load the sums (and a pause) were weighed at: within twofold of it."""
        return self.batch / 2 <= n <= 2 * self.batch

    def observe_host(self, seconds: float) -> None:
        if seconds > 0.0:
            self.host_s = seconds

    def weigh(self, n: int, tau: float, on_s: float, off_s: float) -> None:
        probe, self._probe = self._probe, False
        self.sample = None
        if not (n > 0 and on_s > 0.0 and off_s > 0.0):
            return
        # A probe is weighed alone (the sums hold what made drafting pause); another load has other costs.
        if probe or not self._same_load(n):
            self._reset(n)
        d = self.decay
        self.requests, self.tokens = d * self.requests + n, d * self.tokens + tau
        self.on_s, self.off_s = d * self.on_s + on_s, d * self.off_s + off_s
        self.steps += 1
        if not probe and self.steps < self.min_steps:
            return
        if self.tokens * self.off_s >= self.requests * self.on_s:  # drafting pays: the next pause is short again
            self.length = self.first
        else:
            self.left, self.length = self.length, min(2 * self.length, self.longest)
            self._reset(n)


class StepTimeFit:
    """Measured step times against the modelled ones, as measured = a0 + a1 * bare + b * (modelled - bare), read as
    measured = b * (modelled + c): `bare` is the modelled time of the same step with no drafts.

    b is what a modelled second of verified drafts costs in measured seconds; it alone sets which drafts pay (the
    policy weighs tokens against its own past steps' time). A machine uniformly slower than its profile (contention,
    another clock) has a1 = b and changes no choice. c > 0 is time every step pays that the model leaves out (a
    serving front end, the scheduler, sampling) and makes tokens cheaper against the step; c < 0 is verified tokens
    dearer against the base step than the profile says (a compute-bound engine slowed by what it verifies), and makes
    them dearer. `offset(lowest, bare)` returns c for a step with that bare time, never below `lowest` (the policy
    passes a fraction of the base step, so a modelled step stays positive).

    The base step and the drafts are fitted apart because their modelled times vary for different reasons: the base
    with the batch and its contexts, the drafts with what the policy keeps. A prior whose base step follows context
    length differently from the engine (vLLM-CPU's profile at 2k tokens against its served steps: the prior's base
    step triples from 256 to 2k tokens, the engine's hardly moves) would otherwise be read, once requests of
    different lengths follow each other, as drafts nearly free (a slope of 0.1 and 400 ms of offset, measured on one
    client sending a 2k-token code edit after chat prompts), and the policy drafted single tokens that cost a third
    of the step. a1 is shrunk toward the scale until the base step has varied enough to be measured.

    Decayed least squares, made robust three ways. (1) The scale: a decayed mean of measured / modelled, each
    ratio bounded at four times the scale so far (four before the first), so one pause (a collection, a
    preemption) moves the fit a little and a steady excess fully, and an engine many times slower than its prior
    (a CPU prior on a slower machine, contexts longer than profiled) is followed within a few steps rather than
    clipped where it drafts most. (2) The slope is shrunk toward an anchor where the drafts' modelled times vary too
    little (relative spread under `shrink` of the modelled step) to tell a slope from an offset: until the drafts have
    varied enough to measure a slope, a1 as measured (the price of the base step's tokens; the scale, a uniform factor
    that changes no choice, until the base step has varied), then the last slope so measured, so that when drafting
    stops (every step alike) the fit keeps what it learnt instead of drifting back to the prior, which would reprice
    the tokens and restart drafting with nothing new learnt. (3) The slope stays
    within `spread` of the scale either way, and the offset is 0 until `min_fits` steps are in: a few noisy
    intervals cannot make verified tokens look free or prohibitive.
    """

    def __init__(self, decay: float, shrink: float = 0.05, spread: float = 16.0, min_fits: float = 3.0) -> None:
        self.decay, self.shrink, self.spread, self.min_fits = decay, shrink, spread, min_fits
        # decayed sums: weight, modelled x, measured y, x^2, x*y; and of the base step z: z, z^2, z*x, z*y
        self.w = self.m = self.y = self.mm = self.my = 0.0
        self.z = self.zz = self.zm = self.zy = 0.0
        self.ratio = 0.0  # decayed sum of the bounded measured / modelled ratios (scale = ratio / w)
        self.anchor: float | None = None  # the last slope the data measured (None: none yet)
        # (a1, b, a0) and (lowest, bare, offset), until the next add: both are read every step
        self._coef: tuple[float, float, float] | None = None
        self._offset: tuple[float, float, float] | None = None

    @property
    def fitted(self) -> bool:
        """The offset is measured (`min_fits` steps in): it holds what every measured step pays beyond the model,
        the drafting step's host time included."""
        return self.w >= self.min_fits

    @property
    def scale(self) -> float:
        """The typical measured / modelled ratio (1 before any step)."""
        return self.ratio / self.w if self.w > 0.0 else 1.0

    def add(self, modelled: float, measured: float, bare: float = 0.0) -> None:
        """One engine step: its modelled time, the time measured, and the modelled time of the same step with no
        drafts (0: not told apart, the whole modelled time read as drafts')."""
        self._offset = self._coef = None
        y = min(measured, 4.0 * self.scale * modelled)
        d = self.decay
        self.ratio = d * self.ratio + y / modelled
        self.w = d * self.w + 1.0
        self.m = d * self.m + modelled
        self.y = d * self.y + y
        self.mm = d * self.mm + modelled * modelled
        self.my = d * self.my + modelled * y
        self.z = d * self.z + bare
        self.zz = d * self.zz + bare * bare
        self.zm = d * self.zm + bare * modelled
        self.zy = d * self.zy + bare * y
        moments = self._moments()
        if moments[1] > moments[5]:  # the drafts varied enough to measure the slope: remember it for when they stop
            self.anchor = self._solve(moments)[1]

    def _moments(self) -> tuple[float, ...]:
        """Centred (base, base), (drafts, drafts), (base, drafts), (base, y), (drafts, y), and the ridge's weight."""
        w = self.w
        m_bar, y_bar, z_bar = self.m / w, self.y / w, self.z / w
        d_bar = m_bar - z_bar  # drafts: modelled - base
        szz = max(self.zz - w * z_bar * z_bar, 0.0)
        sdd = max(self.mm - 2.0 * self.zm + self.zz - w * d_bar * d_bar, 0.0)
        szd = self.zm - self.zz - w * z_bar * d_bar
        szy = self.zy - w * z_bar * y_bar
        sdy = self.my - self.zy - w * d_bar * y_bar
        return szz, sdd, szd, szy, sdy, w * (self.shrink * m_bar) ** 2  # the ridge's weight

    def _solve(self, moments: tuple[float, ...]) -> tuple[float, float, float]:
        """(a1, b, a0): the ridge pulls b toward the anchor and a1 toward the scale, each with the weight `prior`.
        a1's pull is to a constant, not to b: where the base step hardly varied, a1 is whatever the old steps of
        another batch or context say, and a pull toward b would drag b along with it."""
        # Plain floats, not numpy scalars: this runs on every engine step, where np.clip alone costs 2 us.
        szz, sdd, szd, szy, sdy, prior = moments
        scale = self.scale
        # [szz + p, szd; szd, sdd + p] (a1, b) = (szy + p scale, sdy + p anchor)
        p00, p11 = szz + prior, sdd + prior
        det = p00 * p11 - szd * szd
        if prior <= 0.0 or det <= 0.0:
            a1 = b = scale if self.anchor is None else self.anchor
        else:
            r0 = szy + prior * scale
            anchor = self.anchor
            if anchor is None:
                # No drafts measured yet: a drafted token is priced as the base step's tokens are measured to cost
                # (a1 alone, shrunk toward the scale), not at the scale. An engine whose base step hardly follows
                # the prior (a tiny model on the CPU prior: 50 ms where 200-950 ms are modelled) would otherwise
                # keep the prior's price of drafts, which at B = 256 keeps few, and never measure what they cost.
                anchor = max((r0 * p11 - szd * (sdy + prior * scale)) / det, 0.0)
            r1 = sdy + prior * anchor
            a1 = (r0 * p11 - szd * r1) / det
            b = (p00 * r1 - szd * r0) / det
        b = min(max(b, scale / self.spread), scale * self.spread)
        a1 = max(a1, 0.0)
        a0 = (self.y - a1 * self.z - b * (self.m - self.z)) / self.w
        return a1, b, a0

    def _coefficients(self) -> tuple[float, float, float]:
        c = self._coef
        if c is None:
            c = self._coef = (1.0, 1.0, 0.0) if self.w == 0.0 else self._solve(self._moments())
        return c

    def slope(self) -> float:
        return self._coefficients()[1]

    def unexplained(self) -> float | None:
        """The measured time beyond the modelled, per step, taken as every step's own (a slope of 1), where the steps
        have never varied enough to measure a slope; None where they have."""
        return None if self.anchor is not None or self.w == 0.0 else (self.y - self.m) / self.w

    def offset(self, lowest: float = 0.0, bare: float = 0.0) -> float:
        """c of a step whose modelled time with no drafts is `bare` (0: the fit's steps were not told apart)."""
        cached = self._offset
        if cached is not None and cached[0] == lowest and cached[1] == bare:
            return cached[2]
        c = self._fit_offset(lowest, bare)
        self._offset = (lowest, bare, c)
        return c

    def _fit_offset(self, lowest: float, bare: float) -> float:
        if self.w < self.min_fits:
            return 0.0
        a1, b, a0 = self._coefficients()
        c = (a0 + (a1 - b) * bare) / b
        if c < 0.0:
            # Below 0 only where the data, not the prior, set the slope (now or before): over steps that never
            # varied, a machine faster than its profile would otherwise read as dearer tokens.
            moments = self._moments()
            lowest = lowest if moments[1] > moments[5] or self.anchor is not None else 0.0
        return max(c, lowest)
