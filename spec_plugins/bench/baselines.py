"""Other projects' model-free drafters behind our `Proposer` protocol, for replay benchmarks.

Both adapters translate only; the drafting logic is the upstream code, imported lazily so that
importing this module needs neither package.

* ``arctic`` -- ``arctic_inference.suffix_decoding.SuffixDecodingCache`` (ArcticInference 0.1.1,
  the implementation vLLM's native ``suffix`` method imports), driven the way vLLM 0.32's
  ``SuffixDecodingProposer`` drives it, with that method's defaults: ``max_tree_depth=24``,
  ``max_cached_requests=10000``, ``max_spec_factor=1.0``, ``min_token_prob=0.1``, path drafts
  (``use_tree_spec=False``), and the pattern = the last ``max_tree_depth`` context tokens. (The
  ArcticInference vLLM plugin uses depth 64 and 100000 cached requests instead; pass them as
  options to compare.) One difference from vLLM's lifecycle, shared with our own proposers: the
  protocol does not say where the prompt ends, so everything in a request's first `propose` is
  started as the prompt, and only later tokens go through ``add_active_response`` (in vLLM the
  first sampled token is already a response token; one token per request).
* ``vllm_ngram`` -- vLLM's prompt-lookup kernel
  (``vllm.v1.spec_decode.ngram_proposer._find_longest_matched_ngram_and_propose_tokens``, numba),
  called per request as vLLM's batch kernel does, with ``prompt_lookup_min=2``,
  ``prompt_lookup_max=5`` (the sizes our own ``ngram`` proposer defaults to). It is compiled on
  construction so that no drafting call pays for the JIT.

Both also expose ``start(req_id, prompt)`` / ``append(req_id, tokens)`` where the upstream code
has an incremental update, which the replay benchmark uses to time updates on their own.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import numpy as np
import pydantic

from spec_plugins.bench.vllm034_suffix_np import Vllm034NgramReplay, Vllm034SuffixReplay
from spec_plugins.core import Draft, DraftRequest

ARCTIC_INSTALL_HINT = (
    "arctic_inference is not installed; it builds from source: "
    "pip install nanobind==2.9.2 && CMAKE_ARGS=\"-DPython_EXECUTABLE=$(command -v python)\" "
    "pip install --no-build-isolation --no-deps arctic-inference==0.1.1"
)


def _int32(tokens: Sequence[int]) -> np.ndarray:
    """A contiguous int32 view (a copy only when needed): Arctic's zero-copy overloads require it."""
    return np.ascontiguousarray(tokens, dtype=np.int32)


class ArcticSuffix:
    """ArcticInference's SuffixDecodingCache as a Proposer (vLLM's native `suffix` settings)."""

    name = "arctic"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        max_tree_depth: int = pydantic.Field(default=24, ge=1)
        max_cached_requests: int = pydantic.Field(default=10000, ge=0)
        max_spec_factor: float = pydantic.Field(default=1.0, ge=0.0)
        max_spec_offset: float = 0.0
        min_token_prob: float = pydantic.Field(default=0.1, ge=0.0, le=1.0)
        use_tree_spec: bool = False

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError as exc:
            raise ImportError(f"{ARCTIC_INSTALL_HINT} ({exc})") from None
        o = self.options
        self.cache = SuffixDecodingCache(max_tree_depth=o.max_tree_depth, max_cached_requests=o.max_cached_requests)

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        cache, o, out = self.cache, self.options, []
        for r in requests:
            tokens = _int32(r.tokens)
            if r.req_id not in cache.active_requests:
                self.start(r.req_id, tokens)
            elif r.num_new:
                cache.add_active_response(r.req_id, tokens[len(tokens) - r.num_new:])
            if r.max_draft == 0:
                out.append(Draft())
                continue
            draft = cache.speculate(
                r.req_id,
                tokens[max(0, len(tokens) - o.max_tree_depth):],
                max_spec_tokens=r.max_draft,
                max_spec_factor=o.max_spec_factor,
                max_spec_offset=o.max_spec_offset,
                min_token_prob=o.min_token_prob,
                use_tree_spec=o.use_tree_spec,
            )
            out.append(Draft(list(draft.token_ids), None, list(draft.probs)))
        return out

    def finish(self, req_id: Hashable) -> None:
        if req_id in self.cache.active_requests:
            self.cache.stop_request(req_id)

    def start(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        if req_id in self.cache.cached_requests:  # a reused id: forget its old response, as vLLM does
            self.cache.evict_cached_response(req_id)
        self.cache.start_request(req_id, _int32(prompt_ids))

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        self.cache.add_active_response(req_id, _int32(token_ids))


class VllmNgram:
    """vLLM's numba prompt-lookup kernel as a Proposer (stateless, like vLLM's)."""

    name = "vllm_ngram"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        prompt_lookup_min: int = pydantic.Field(default=2, ge=1)
        prompt_lookup_max: int = pydantic.Field(default=5, ge=1)

        @pydantic.model_validator(mode="after")
        def _ordered(self) -> "VllmNgram.Options":
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError(
                    f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                    f"prompt_lookup_max ({self.prompt_lookup_max})"
                )
            return self

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        try:
            from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens
        except ImportError as exc:
            raise ImportError(f"vllm_ngram needs vLLM's n-gram proposer (vllm.v1.spec_decode.ngram_proposer): {exc}") from None
        self._kernel: Callable[..., np.ndarray] = _find_longest_matched_ngram_and_propose_tokens
        self._kernel(np.array([1, 2, 3, 1, 2], dtype=np.int32), 2, 5, 1 << 30, 4)  # JIT now, not while timed

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        lo, hi = self.options.prompt_lookup_min, self.options.prompt_lookup_max
        out = []
        for r in requests:
            if r.max_draft == 0:
                out.append(Draft())
                continue
            # max_model_len only limits drafts near the context limit; the cap is max_draft.
            draft = self._kernel(_int32(r.tokens), lo, hi, 1 << 30, r.max_draft)
            out.append(Draft(draft.tolist()))
        return out

    def finish(self, req_id: Hashable) -> None:
        pass


class ContinuedSuffixTree:
    """Our suffix tree's draft, then the tree's own continuation past where it stops, up to K: the other filler
    candidate for vLLM 0.34's Model Runner V2, which verifies all K slots (`--accounting mrv2`). The continuation
    comes from a second tree fed the same contexts, with no probability floor and no length budget; where its path
    does not start with the draft, the draft stays as it is (the rest is then filled with the last token)."""

    name = "suffix_tree_continued"
    EXTEND = {"min_token_prob": 0.0, "max_spec_factor": 1000.0, "copy_min_prob": 0.0}

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

    def __init__(self) -> None:
        from spec_plugins.registry import create_proposer

        self.primary = create_proposer("suffix_tree", {})
        self.extender = create_proposer("suffix_tree", self.EXTEND)

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r, d, e in zip(requests, self.primary.propose(requests), self.extender.propose(requests)):
            tokens, longer = list(d.tokens), list(e.tokens)
            if len(tokens) < r.max_draft and longer[: len(tokens)] == tokens:
                tokens = longer[: r.max_draft]
            out.append(Draft(tokens))
        return out

    def finish(self, req_id: Hashable) -> None:
        self.primary.finish(req_id)
        self.extender.finish(req_id)


def _vllm034_suffix() -> type:
    from spec_plugins.bench.vllm034_suffix import Vllm034Suffix

    return Vllm034Suffix


def _vllm034_ngram() -> type:
    from spec_plugins.bench.vllm034_suffix import Vllm034Ngram

    return Vllm034Ngram


class _Lazy(dict):
    """Baselines whose module needs another environment (vLLM 0.34), imported when asked for."""

    def __getitem__(self, name: str) -> type:
        value = super().__getitem__(name)
        return value() if name in LAZY else value


LAZY = {"vllm034_suffix", "vllm034_ngram"}
BASELINES: dict[str, type] = _Lazy({"arctic": ArcticSuffix, "vllm_ngram": VllmNgram,
                                    "suffix_tree_continued": ContinuedSuffixTree, "vllm034_suffix": _vllm034_suffix,
                                    "vllm034_suffix_np": Vllm034SuffixReplay, "vllm034_ngram": _vllm034_ngram,
                                    "vllm034_ngram_np": Vllm034NgramReplay})


def create_baseline(name: str, options: dict[str, Any] | None = None) -> Any:
    """Build baseline `name` with validated options; ValueError names a bad option."""
    cls = BASELINES[name]
    try:
        return cls(**dict(options or {}))
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        where = "".join(f".{p}" for p in err["loc"])
        raise ValueError(f"proposer_options[{name}]{where}: {err['msg']} (got {err.get('input')!r})") from None
