"""Draft verification: greedy prefix matching and exact rejection sampling.

Both verifiers take the target's logits at the D+1 positions fed in one step (the last committed
token, then the D draft tokens): row i is the target's distribution for the token after draft
position i-1, so row i judges draft token i and row D gives the bonus token when every draft is
accepted. Both return (emitted, num_accepted), where emitted is the accepted draft prefix plus one
token from the target, so every step makes progress even when the draft is useless.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at `temperature`, in float64 on the CPU.

    Float64 keeps the p/q ratios and residuals accurate for tiny probabilities, and the CPU keeps
    sampling reproducible with one CPU `torch.Generator` whatever device the target runs on.
    """
    if temperature <= 0:
        raise ValueError(f"temperature: expected > 0 for sampling, got {temperature}")
    return torch.softmax(logits.detach().to("cpu", torch.float64) / temperature, dim=-1)


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """One token from a single logits row: argmax at temperature 0, else a softmax sample."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(target_probs(logits, temperature), 1, generator=generator))


def verify_greedy(target_logits: torch.Tensor, draft_tokens: Sequence[int]) -> tuple[list[int], int]:
    """Accept the longest draft prefix that matches the target's argmax, then add its next argmax.

    The output is token-identical to plain greedy decoding of the target: every emitted token is
    the target's argmax given the tokens before it.
    """
    best = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(draft_tokens) and int(draft_tokens[n]) == best[n]:
        n += 1
    return [int(t) for t in draft_tokens[:n]] + [best[n]], n


def verify_sampled(
    target_logits: torch.Tensor,
    draft_tokens: Sequence[int],
    draft_probs: Any,
    temperature: float,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Speculative sampling (Leviathan et al. 2023): the emitted tokens follow the target exactly.

    Draft token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)). At the first
    rejection a replacement is drawn from normalize(max(0, p_i - q_i)), the part of p the draft
    under-covers, and the step ends; if all D are accepted a bonus token is drawn from p_D.

    draft_probs is q, shape [D, V] (tensor or array), where x_i was sampled from q_i. With None the
    draft is treated as one-hot (q_i(x_i) = 1): accept with probability p_i(x_i), else sample from
    p_i with x_i removed. That case is exact for any draft token, however it was chosen.
    """
    p = target_probs(target_logits, temperature)  # [D+1, V]
    num_draft = len(draft_tokens)
    x = torch.as_tensor(list(draft_tokens), dtype=torch.long)
    rows = torch.arange(num_draft)
    q = None if draft_probs is None else torch.as_tensor(draft_probs, dtype=torch.float64).cpu()
    px = p[rows, x]
    qx = torch.ones(num_draft, dtype=torch.float64) if q is None else q[rows, x]

    # All D coins at once: the accepted prefix ends at the first failed coin. u < px/qx is written
    # as u*qx < px so that qx == 0 (a draft token q calls impossible) does not divide by zero.
    u = torch.rand(num_draft, dtype=torch.float64, generator=generator)
    rejected = (u * qx >= px).tolist()
    n = rejected.index(True) if True in rejected else num_draft

    if n == num_draft:
        extra = p[num_draft]
    elif q is None:
        extra = p[n].clone()
        extra[x[n]] = 0.0
    else:
        extra = (p[n] - q[n]).clamp_min(0.0)
    if not float(extra.sum()) > 0.0:
        # Only reachable through rounding (a rejection implies p_i != q_i somewhere); p_i is the
        # distribution the residual approximates.
        extra = p[n]
    token = int(torch.multinomial(extra, 1, generator=generator))  # multinomial normalizes
    return [int(t) for t in draft_tokens[:n]] + [token], n
