"""Triton kernels where the engines' kernels lose work to tile alignment (installed as `spec_plugins.kernels`).

verify_attention  verification attention (`verify_attention.verify_attention`): the verified token plus the
                  drafts of each request, causal within that block, ragged across the batch, with the
                  G * (1 + D) rows of a grouped-query KV head packed into one tile so each KV block is read
                  once for all of them; contiguous or paged KV.
dspark_walk       the DSpark Markov walk of a block (`dspark_walk.dspark_walk`): the sequential
                  gather -> rank-r projection -> add -> argmax loop of `markov_walk` (greedy; vanilla, gated
                  and rnn heads; with or without draft_topk) as one launch.

Dispatch rule (both): the Triton kernel for CUDA tensors, or for any tensors when the module was imported
with TRITON_INTERPRET=1 (CPU testing); otherwise (or without triton) the torch reference
(`verify_attention_reference`, `dspark_walk_reference`). `*_triton` call the kernels directly.

Where they are used: the DSpark walk through `proposers.dspark.heads.walk_block`, which both the reference
engine's `DSparkDrafter.propose_block` and the vLLM DSpark drafter's `sample_block` call: greedy blocks on CUDA
take the kernel (SPEC_PLUGINS_FUSED_WALK=0 turns it off; on an H200 the whole block is 1.7-5.5x faster with it,
`benchmarks/gpu_kernels.py`), the rest the torch walk. Verification attention is not wired into an engine: in vLLM it would
be an attention backend (a `vllm.v1.attention.backends` class selected by `VLLM_ATTENTION_BACKEND`, registered
from our general plugin) or a `torch.library` custom op the model's attention calls; both replace vLLM's own
backend for every layer, a large patch, so they wait for GPU numbers that say it pays.
"""
