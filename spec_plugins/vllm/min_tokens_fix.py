"""`min_tokens` at the bonus position: a defect of vLLM's V1 sampler under speculative decoding, and its mend.

vLLM masks a request's stop tokens until it has `min_tokens` output tokens (`MinTokensLogitsProcessor`). Under
speculative decoding the rejection sampler masks the draft positions by their own index
(`apply_with_spec_decode`), but samples the bonus token (the one after a fully accepted draft) through
`Sampler.apply_logits_processors(..., predict_bonus_token=True)`, where the processor's `apply` masks every
request still short of `min_tokens` by its committed output length, without this step's drafts. So when the
drafts carry a request to `min_tokens`, its bonus position is masked all the same: a stop token the model
picks there is replaced by another token, and the output runs on past where it ends without speculation
(greedy: `min_tokens=12` with a stop token at position 12 gave 13 tokens; `integration_tests/
test_serving_features.py`, the "min_tokens before a stop token" rows, fail without this mend).

`install(sampler_cls)` wraps `Sampler.apply_logits_processors`: for the bonus call only, the stop-token mask
rows of requests whose committed length plus this step's drafts reaches `min_tokens` are left out of the
processor's index tensors for the duration of the call, and put back after it. Installed with the runner
wrapper (plugin.install) by our proposers' and draft models' constructors, so it acts in engines that use
them; vLLM's own methods on the V1 runner keep the defect. Only on the versions in `AFFECTED` (both have it,
a contract test reads their sources); `SPEC_PLUGINS_MIN_TOKENS_FIX=0` leaves vLLM's method in place.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any, Iterator

from spec_plugins.vllm import patches
from spec_plugins.vllm.versions import version_in

logger = logging.getLogger("vllm.spec_plugins")

ENV_SWITCH = patches.MIN_TOKENS_FIX_SWITCH
AFFECTED = ((0, 32), (0, 33))
SAMPLER_MODULE = "vllm.v1.sample.sampler"


def affected(found: str | None) -> bool:
    return version_in(found, AFFECTED)


def install(sampler_cls: Any, found: str | None) -> bool:
    """Wrap `sampler_cls.apply_logits_processors` once; True when the mend is in place. Never raises."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0" or not affected(found):
        return False
    try:
        def wrap(orig: Any) -> Any:
            @functools.wraps(orig)
            def apply_logits_processors(self: Any, logits: Any, sampling_metadata: Any, predict_bonus_token: bool,
                                        *args: Any, **kwargs: Any) -> Any:
                if not predict_bonus_token:
                    return orig(self, logits, sampling_metadata, predict_bonus_token, *args, **kwargs)
                with bonus_positions(sampling_metadata):
                    return orig(self, logits, sampling_metadata, predict_bonus_token, *args, **kwargs)

            return apply_logits_processors

        return patches.replace("min_tokens_bonus", sampler_cls, wrap)
    except Exception as exc:
        logger.warning("spec-plugins: could not mend min_tokens at the bonus position (%s: %s); requests with "
                       "min_tokens may run past a stop token under speculative decoding.", type(exc).__name__, exc)
        return False


@contextlib.contextmanager
def bonus_positions(sampling_metadata: Any) -> Iterator[None]:
    """While it is open, `MinTokensLogitsProcessor.apply` masks only the requests whose bonus position (committed
    output + this step's drafts) is still short of `min_tokens`."""
    import torch

    drafts = getattr(sampling_metadata, "spec_token_ids", None) or []
    saved = []
    for proc in sampling_metadata.logitsprocs.non_argmax_invariant:
        entries = getattr(proc, "min_toks", None)
        if not entries or not hasattr(proc, "logits_slice"):
            continue
        reached = {i for i, (min_tokens, out, *_rest) in entries.items()
                   if i < len(drafts) and len(out) + len(drafts[i]) >= min_tokens}
        if not reached:
            continue
        saved.append((proc, entries, proc.logits_slice, proc.restore_logits_slice))
        rows = proc.logits_slice[0]
        done = torch.tensor(sorted(reached), dtype=rows.dtype, device=rows.device)

        def still_masked(index: tuple[Any, Any]) -> tuple[Any, Any]:
            keep = ~torch.isin(index[0], done)
            return index[0][keep], index[1][keep]

        proc.min_toks = {i: e for i, e in entries.items() if i not in reached}
        proc.logits_slice = still_masked(proc.logits_slice)
        proc.restore_logits_slice = still_masked(proc.restore_logits_slice)
    try:
        yield
    finally:
        for proc, entries, logits_slice, restore_slice in saved:
            proc.min_toks, proc.logits_slice, proc.restore_logits_slice = entries, logits_slice, restore_slice
