"""vLLM `custom_class` proposers serving any registered spec-plugins proposer.

    vllm serve MODEL \
      --speculative-config '{"method":"custom_class","model":"spec_plugins.vllm.Ngram","num_speculative_tokens":8}' \
      --additional-config '{"spec_plugins":{"proposer_options":{"max_ngram":4}}}'

vLLM (MRV1) calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` after each step's
bookkeeping: row i's committed context is `token_ids_cpu[i, :num_tokens_no_spec[i]]`, and
`len(sampled_token_ids[i]) - 1` drafts of that row were accepted in the previous step. The adapter
turns rows into DraftRequests, lets the policy cap them (never above num_speculative_tokens: the
scheduler does not clamp), calls the proposer and returns plain lists.

This module must not import numba/llvmlite (it breaks vLLM's CPU engine start) nor vLLM itself.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np

from spec_plugins.core import DraftRequest, apply_policy, check_cap, check_drafts
from spec_plugins.vllm.settings import settings_from_additional_config


class SpecPluginsProposer:
    """Serves the proposer named in `additional_config.spec_plugins.proposer`."""

    fixed_proposer: ClassVar[str | None] = None

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = check_cap(
            getattr(spec, "num_speculative_tokens", None), "speculative_config.num_speculative_tokens"
        )
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.settings = settings_from_additional_config(
            getattr(vllm_config, "additional_config", None), self.fixed_proposer
        )
        self.proposer, self.policy = self.settings.build()
        # Request ids per batch row. Without the runner's ids a row stands for its request; rows
        # can be reordered between steps, which only blurs per-request policy statistics.
        self.row_req_ids: Sequence[Any] | None = None
        self._drafted: dict[Any, int] = {}

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        # The CPU runner calls this unconditionally; model-free proposers need nothing from the target.
        load = getattr(self.proposer, "load", None)
        if load is not None and args:
            load(args[0])

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        rows, requests = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prefill chunk in progress: nothing to draft from yet
                continue
            req_id = self._req_id(i)
            drafted = self._drafted.pop(req_id, None)
            if drafted is not None:
                self.policy.observe(req_id, drafted, min(len(sampled) - 1, drafted))
            n = int(num_tokens_no_spec[i])
            room = max(0, self.max_model_len - n - 1)
            rows.append(i)
            requests.append(
                DraftRequest(
                    req_id=req_id,
                    tokens=token_ids_cpu[i, :n],
                    num_new=len(sampled),
                    max_draft=min(self.num_speculative_tokens, room),
                )
            )
        if not requests:
            return out
        apply_policy(self.policy, requests)
        drafts = self.proposer.propose(requests)
        check_drafts(requests, drafts, who=f"proposer {self.settings.proposer!r}")
        for i, req, draft in zip(rows, requests, drafts):
            out[i] = [int(t) for t in draft.tokens]
            if out[i]:
                self._drafted[req.req_id] = len(out[i])
        return out

    def finish(self, req_id: Any) -> None:
        self._drafted.pop(req_id, None)
        self.proposer.finish(req_id)
        self.policy.finish(req_id)

    def _req_id(self, row: int) -> Any:
        ids = self.row_req_ids
        return ids[row] if ids is not None and row < len(ids) else f"row-{row}"


class Ngram(SpecPluginsProposer):
    """Prompt-lookup n-gram proposer (`proposers/ngram`)."""

    fixed_proposer = "ngram"
