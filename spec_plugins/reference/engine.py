"""The reference engine: a plain speculative-decoding loop over a Hugging Face causal LM.

It serves as the oracle the real engines (vLLM, TensorRT-LLM) are compared with, so it favours being
obviously correct over being fast: one request, batch size 1, one target forward per step, and
the sampling maths in `verify.py`. Any `Proposer` and any `DraftLengthPolicy` plug in unchanged.

The loop depends only on a four-member target interface (`prefill`, `extend`, `crop`,
`num_cached`), so tests can swap the transformer for a cheap table-driven model and check the
output distribution statistically.

Model-based drafters (DFlash, DSpark) read the target's hidden states: a proposer that lists decoder-layer
ids in a `target_taps` attribute gets, in `DraftRequest.features`, the concatenated outputs of those layers
for the committed positions it has not seen yet (accepted rows only; the newest token has none yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from spec_plugins.core import DraftLengthPolicy, FixedLength, Proposer, TapsTarget
from spec_plugins.drafting import DraftingLayer
from spec_plugins.reference import verify


class Target(Protocol):
    """What the loop needs from a target model: logits for new tokens and a KV cache it can roll back.

    With a proposer that has `target_taps`, `prefill` and `extend` are called as (ids, taps) and return
    (logits, features) instead; `HFTarget` supports both forms.
    """

    @property
    def num_cached(self) -> int: ...

    def prefill(self, ids: Sequence[int]) -> torch.Tensor: ...

    def extend(self, ids: Sequence[int]) -> torch.Tensor: ...

    def crop(self, n: int) -> None: ...


class HFTarget:
    """A transformers causal LM plus the DynamicCache that holds its past keys and values.

    `extend` feeds tokens after the cached ones and returns a logits row per fed token; `crop`
    discards cached positions after the first n, which is how rejected draft tokens are undone.
    Models with sliding-window or linear-attention layers cannot be rolled back this way.
    """

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self._cache_class = DynamicCache
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)

    @property
    def num_cached(self) -> int:
        return self.cache.get_seq_length()

    def prefill(self, ids: Sequence[int], taps: Sequence[int] | None = None):
        """Start a new sequence: drop any previous cache and run the prompt. Returns as `extend`."""
        self.cache = self._cache_class(config=self.model.config)
        return self.extend(ids, taps)

    @torch.no_grad()
    def extend(self, ids: Sequence[int], taps: Sequence[int] | None = None):
        """Run `ids` at positions num_cached.. and cache them. Returns logits [len(ids), V], or with `taps`
        (decoder-layer ids) the pair (logits, features [len(ids), len(taps) * hidden]).

        Tap k is the output of decoder layer k, HF's hidden_states[k + 1]. HF's last entry is post-norm, so
        tapping the last layer gives the normed output, not the raw one a drafter is usually trained on.
        """
        start = self.num_cached
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        # Explicit positions: the fed tokens continue the cached ones, whatever crop did before.
        positions = torch.arange(start, start + len(ids), device=self.device).unsqueeze(0)
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                         output_hidden_states=taps is not None)
        if taps is None:
            return out.logits[0]
        return out.logits[0], torch.cat([out.hidden_states[k + 1][0] for k in taps], dim=-1)

    def crop(self, n: int) -> None:
        """Keep the first n cached positions."""
        extra = self.num_cached - n
        if extra < 0:
            raise ValueError(f"crop: cache holds {self.num_cached} tokens, cannot keep {n}")
        if extra > 0:
            # A negative argument removes that many tokens; transformers 5.x deprecates the older
            # positive form (an absolute length), and 4.x reads negatives the same way.
            self.cache.crop(-extra)


@dataclass
class StepStats:
    """One target forward pass: how many tokens were drafted and how many of those were accepted."""

    drafted: int
    accepted: int


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only
    steps: list[StepStats] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens committed per target forward (accepted + 1), the prefill step included."""
        if not self.steps:
            return 0.0
        return sum(s.accepted + 1 for s in self.steps) / len(self.steps)


def generate(
    target: Target,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    max_draft: int = 8,
    policy: DraftLengthPolicy | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    eos_token_id: int | None = None,
    req_id: Any = "req-0",
    on_step: Callable[[list[int], StepStats], None] | None = None,
) -> GenerationResult:
    """Generate up to max_new_tokens after prompt_ids with draft-and-verify steps.

    Temperature 0 is greedy and token-identical to plain greedy decoding; otherwise the output
    follows the target's softmax at `temperature` exactly, whatever the proposer drafts.
    `on_step(tokens, stats)` is a debug hook called after every step with the committed context
    (prompt + new tokens; the engine's own list, do not modify it).
    """
    # The same drafting layer the engine adapters use (ledger, caps -> propose -> check -> trim), one row.
    drafting = DraftingLayer(proposer, FixedLength() if policy is None else policy, who=type(proposer).__name__)
    config = getattr(getattr(target, "model", None), "config", None)
    if config is not None:  # `adaptive` with a GPU alone: cost the target being run
        drafting.bind_model(config.to_dict(), source="target model config")
    generator = torch.Generator().manual_seed(seed)
    taps = proposer.target_taps if isinstance(proposer, TapsTarget) else None  # a drafter's feature layers

    def forward(run, ids):
        """(logits, features of the fed positions or None) from target.prefill / target.extend."""
        return (run(ids), None) if taps is None else run(ids, taps)

    tokens = [int(t) for t in prompt_ids]  # the committed context: prompt, then accepted output
    num_prompt = len(tokens)
    if max_new_tokens <= 0:
        return GenerationResult([], [])

    # Prefill: the prompt's last logits row gives the first new token; nothing is drafted here.
    logits, features = forward(target.prefill, tokens)
    tokens.append(verify.sample_token(logits[-1], temperature, generator))
    steps = [StepStats(0, 0)]
    if on_step is not None:
        on_step(tokens, steps[-1])

    while len(tokens) - num_prompt < max_new_tokens and tokens[-1] != eos_token_id:
        # Invariant: the cache holds every committed token but the newest, which is fed below.
        remaining = max_new_tokens - (len(tokens) - num_prompt)
        # A step emits the accepted drafts plus one target token, so the draft gets remaining - 1.
        budget = min(max_draft, remaining - 1)
        # The live context list is passed without a copy (long generations stay linear in time);
        # proposers treat it as read-only. The proposer is called even at cap 0 so a stateful proposer
        # sees every committed token.
        # features: rows for positions len(tokens) - 1 - len(features) .. len(tokens) - 2, the committed
        # positions the target has run since the last request (the newest token has not been run yet).
        draft = drafting.step([req_id], [tokens], [len(tokens)], max_draft=budget, features=[features]).draft(0)
        draft_tokens = draft.tokens

        # One forward scores every draft position at once: row i is the target's next-token
        # distribution after the newest committed token and draft_tokens[:i].
        logits, features = forward(target.extend, [tokens[-1]] + draft_tokens)
        if temperature == 0:
            emitted, accepted = verify.verify_greedy(logits, draft_tokens)
        else:
            emitted, accepted = verify.verify_sampled(logits, draft_tokens, draft.probs, temperature, generator)

        if eos_token_id is not None and eos_token_id in emitted:
            emitted = emitted[: emitted.index(eos_token_id) + 1]
        emitted = emitted[:remaining]
        tokens.extend(emitted)
        if features is not None:
            # Rows 0 .. len(emitted) - 1 (the old newest token and the accepted drafts) are now committed;
            # the rejected drafts' rows are dropped, so a drafter's cache never holds them.
            features = features[: len(emitted)]
        # Roll back the rejected drafts. The cache keeps the accepted drafts (computed from the
        # right context), not the newest token, which the target has not seen yet.
        target.crop(len(tokens) - 1)

        steps.append(StepStats(len(draft_tokens), accepted))
        drafting.verified([req_id], [accepted])
        if on_step is not None:
            on_step(tokens, steps[-1])

    drafting.finish(req_id)
    return GenerationResult(tokens[num_prompt:], steps)
