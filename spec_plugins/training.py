"""`spec-plugins train-drafter`: train a DFlash or DSpark drafter for a local HF target, written in the
`speculators` checkpoint format (what vLLM's `dflash` / `dspark` methods and our loaders read).

    spec-plugins train-drafter --target ~/.cache/spec-plugins/models/SmolLM2-135M-Instruct \\
        --kind dspark --data chats.jsonl --out drafts/smollm2-dspark --steps 500

Data: a .jsonl file with a `text` field per row (every token is a label) or `prompt` + `response` fields
(only response tokens are labels; `"chat": true` wraps the prompt in the target's chat template, as in
`benchmarks/workloads/`), or a plain .txt file (one document). Tokenized with the target's tokenizer
and cut into --seq-len windows. The target stays frozen; each step runs it once for the tap features, samples
--anchors blocks per row and trains the draft (DFlash: decayed CE; DSpark: CE + TV + confidence BCE, with a
Markov head). Output folder: config.json + model.safetensors (speculators format) and training.json (the
settings, per-step loss and metrics, timing).

GPU: the same command with `--device cuda` loads the target in bf16 and runs the draft under bf16 autocast
(fp32 master weights, AdamW). Sensible sizes there: a 0.5B-8B target, --layers 1-5, --seq-len 1024-4096,
--batch-size 4-16, --anchors 64-512, --block-size 8-16 (DFlash) / 7 (DSpark), --steps in the thousands over
target-regenerated responses (the drafts learn the target's own outputs best; `--labels target` distils its
greedy tokens when the data was written by someone else). The attention mask is dense, [anchors*B, T +
anchors*B] per row: at T = 4096 with 512 anchors of 16 that is ~50M entries per row, fine on an H100/H200 but
the first thing to swap for a FlexAttention block mask at larger sizes. On CPU keep everything tiny.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

KINDS = ("dflash", "dspark")
DEFAULT_BLOCK = {"dflash": 8, "dspark": 7}  # DFlash: 7 drafts (row 0 is the bonus); DSpark: 7 drafts


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train-drafter", help="train a DFlash / DSpark drafter for a local HF target (speculators format)")
    p.add_argument("--target", required=True, help="local HF model folder (e.g. from `spec-plugins models smollm2`)")
    p.add_argument("--kind", default="dflash", help="dflash (default) or dspark")
    p.add_argument("--data", required=True, help=".jsonl with 'text' or 'prompt'+'response' per row, or a .txt file")
    p.add_argument("--out", required=True, help="output folder: config.json, model.safetensors, training.json")
    p.add_argument("--layers", type=int, default=1, help="draft decoder layers (default 1)")
    p.add_argument("--block-size", type=int, help="query block B (default 8 for dflash: 7 drafts; 7 for dspark: 7 drafts)")
    p.add_argument("--taps", help="comma-separated target decoder layer ids (default: spread like z-lab's, one per draft layer)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per step (default 8)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row; longer documents are cut (default 256)")
    p.add_argument("--anchors", type=int, default=16, help="anchored blocks per row (default 16)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default 6e-4)")
    p.add_argument("--schedule", default="cosine", choices=["cosine", "constant"], help="after 4%% warmup (default cosine)")
    p.add_argument("--gamma", type=float, default=4.0, help="loss decay: w_k = exp(-(k-1)/gamma) (default 4)")
    p.add_argument("--labels", default="data", choices=["data", "target"],
                   help="CE labels: the data's next tokens (default) or the target's greedy tokens")
    p.add_argument("--markov-head", default="vanilla", choices=["vanilla", "gated", "rnn", "none"], help="dspark only (default vanilla)")
    p.add_argument("--markov-rank", type=int, default=64, help="dspark Markov head rank (default 64)")
    p.add_argument("--no-confidence", action="store_true", help="dspark: no confidence head")
    p.add_argument("--confidence-label", default="tv", choices=["tv", "greedy"],
                   help="dspark confidence target: 1 - TV (default) or greedy match")
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token, an unused embedding row, or unk/pad")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    p.add_argument("--cache-features", action="store_true",
                   help="run the target once over all data up front and train on its cached features "
                        "((taps + 1) x hidden floats per token of memory; much faster over several epochs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-rows", type=int, help="use at most this many data rows")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train_drafter)
    return p


# ----------------------------------------------------------------------------------------------- data


def load_examples(path: str | Path, tokenizer: Any, *, max_rows: int | None = None) -> list:
    """Examples (ids, loss mask) from a .jsonl ('text' or 'prompt' + 'response') or a .txt file."""
    from spec_plugins.models import prompt_ids
    from spec_plugins.proposers.dflash.train import Example

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data: no such file {path}")
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if path.suffix == ".txt":
        ids = tokenizer(path.read_text())["input_ids"]
        return [Example(ids, [1] * len(ids))]
    if path.suffix != ".jsonl":
        raise ValueError(f"--data: expected a .jsonl or .txt file, got {path.name}")
    examples = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            if max_rows is not None and len(examples) >= max_rows:
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--data: {path.name} line {line_no} is not JSON ({e.msg})") from None
            if isinstance(row, dict) and isinstance(row.get("text"), str):
                ids = tokenizer(row["text"])["input_ids"] + eos
                examples.append(Example(ids, [1] * len(ids)))
            elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("response"), str):
                prompt = prompt_ids(tokenizer, row["prompt"], bool(row.get("chat")))
                response = tokenizer(row["response"], add_special_tokens=False)["input_ids"] + eos
                examples.append(Example(prompt + response, [0] * len(prompt) + [1] * len(response)))
            else:
                raise ValueError(f"--data: {path.name} line {line_no}: expected a 'text' string or 'prompt' and 'response' strings")
    if not examples:
        raise ValueError(f"--data: {path.name} has no rows")
    return examples


def default_mask_token_id(tokenizer: Any, vocab_size: int) -> int:
    """A token the target never sees as input in our data: the tokenizer's mask token, else the first embedding
    row past the tokenizer (z-lab's choice for Qwen3), else unk, else pad (only its embedding matters)."""
    for candidate in (getattr(tokenizer, "mask_token_id", None),
                      len(tokenizer) if vocab_size > len(tokenizer) else None,
                      tokenizer.unk_token_id, tokenizer.pad_token_id):
        if candidate is not None and 0 <= candidate < vocab_size:
            return int(candidate)
    raise ValueError("--mask-token-id: the tokenizer has no mask, unk or pad token and no unused embedding row; pass one")


# ----------------------------------------------------------------------------------------------- recipe


def _check_args(args: argparse.Namespace) -> None:
    if args.kind not in KINDS:
        raise ValueError(f"--kind: expected one of {', '.join(KINDS)}, got {args.kind!r}")
    if not (Path(args.target) / "config.json").is_file():
        raise ValueError(f"--target: {args.target} is not a local HF model folder (no config.json)")
    if args.block_size is not None and args.block_size < 2:
        raise ValueError(f"--block-size: expected >= 2, got {args.block_size}")
    for name in ("layers", "steps", "batch_size", "anchors", "markov_rank"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if args.seq_len < 4:
        raise ValueError(f"--seq-len: expected >= 4, got {args.seq_len}")
    if args.lr <= 0 or args.gamma <= 0:
        raise ValueError("--lr and --gamma: expected positive numbers")
    if args.max_rows is not None and args.max_rows < 1:
        raise ValueError(f"--max-rows: expected >= 1, got {args.max_rows}")


def _parse_taps(text: str | None, num_target_layers: int, layers: int) -> list[int]:
    from spec_plugins.proposers.dflash import default_target_layer_ids
    from spec_plugins.proposers.dflash.train import check_taps

    if text is None:
        if num_target_layers < 4:
            taps = list(range(num_target_layers - 1))[:layers] or [0]
        else:
            taps = sorted(set(default_target_layer_ids(num_target_layers, layers)))
    else:
        try:
            taps = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"--taps: expected comma-separated integers, got {text!r}") from None
    try:
        check_taps(taps, num_target_layers)
    except ValueError as e:
        raise ValueError(f"--{e}") from None
    return taps


def draft_config(target_config: Any, *, layers: int, block_size: int, mask_token_id: int, taps: list[int]):
    """A draft with the target's width, heads and RoPE (it shares the target's embedding and LM head)."""
    from spec_plugins.proposers.dflash import DFlashConfig

    t = target_config
    rope = getattr(t, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(t, "rope_theta", 10000.0))
    return DFlashConfig.from_dict({
        "model_type": "qwen3", "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
        "num_hidden_layers": layers, "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": getattr(t, "num_key_value_heads", None) or t.num_attention_heads,
        "head_dim": getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
        "vocab_size": t.vocab_size, "rms_norm_eps": getattr(t, "rms_norm_eps", 1e-6), "rope_theta": theta,
        "block_size": block_size, "num_target_layers": t.num_hidden_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": taps},
    })


def cmd_train_drafter(args: argparse.Namespace) -> dict:
    """Run the recipe; returns the training log (also written to <out>/training.json)."""
    _check_args(args)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spec_plugins.proposers.dflash import DFlashDraftModel
    from spec_plugins.proposers.dflash.export import save_speculators
    from spec_plugins.proposers.dflash.train import DFlashObjective, TrainSettings, chunk_examples, train

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device available")
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    examples = load_examples(args.data, tokenizer, max_rows=args.max_rows)
    examples = chunk_examples(examples, args.seq_len)
    if not examples:
        raise ValueError("--data: no row has at least 3 tokens with a label to train on")
    bf16 = device.type == "cuda"
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16 if bf16 else torch.float32).to(device).eval()
    tconf = target.config
    taps = _parse_taps(args.taps, tconf.num_hidden_layers, args.layers)
    block_size = args.block_size or DEFAULT_BLOCK[args.kind]
    mask_id = args.mask_token_id if args.mask_token_id is not None else default_mask_token_id(tokenizer, tconf.vocab_size)
    if not 0 <= mask_id < tconf.vocab_size:
        raise ValueError(f"--mask-token-id: {mask_id} outside the target's vocabulary [0, {tconf.vocab_size})")

    model = DFlashDraftModel(draft_config(tconf, layers=args.layers, block_size=block_size, mask_token_id=mask_id,
                                          taps=taps)).to(device)
    embed = target.get_input_embeddings().weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()
    markov = confidence = None
    if args.kind == "dflash":
        objective = DFlashObjective(model, embed, lm_head, gamma=args.gamma, label_source=args.labels)
    else:
        from spec_plugins.proposers.dspark import ConfidenceHead, MarkovHead
        from spec_plugins.proposers.dspark.train import DSparkObjective, init_markov_

        rank = 0 if args.markov_head == "none" else args.markov_rank
        if rank:
            markov = init_markov_(MarkovHead(tconf.vocab_size, rank, tconf.hidden_size, args.markov_head)).to(device)
        if not args.no_confidence:
            confidence = ConfidenceHead(tconf.hidden_size, rank).to(device)
        objective = DSparkObjective(model, markov, confidence, embed, lm_head, gamma=args.gamma,
                                    confidence_label=args.confidence_label, label_source=args.labels)

    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, num_anchors=args.anchors, lr=args.lr,
                             schedule=args.schedule, seed=args.seed, device=str(device), bf16=bf16,
                             cache_features=args.cache_features, progress=not args.quiet)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    result = train(objective, target, examples, taps, settings, pad_id=pad)

    out = save_speculators(args.out, model, markov=markov, confidence=confidence, target_config=tconf, kind=args.kind,
                           verifier_name_or_path=str(Path(args.target).resolve()))
    tail = result.losses[-10:]
    log = {
        "kind": args.kind, "target": str(args.target), "data": str(args.data), "examples": len(examples),
        "taps": taps, "block_size": block_size, "mask_token_id": mask_id, "device": str(device), "bf16": bf16,
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "seconds": round(result.seconds, 3), "seconds_per_step": round(result.seconds_per_step, 5),
        "final_loss": sum(tail) / len(tail), "losses": result.losses, "metrics": result.metrics,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (out / "training.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"{args.kind}: {args.steps} steps in {result.seconds:.1f}s ({1000 * result.seconds_per_step:.1f} ms/step), "
          f"loss {result.losses[0]:.4f} -> {log['final_loss']:.4f} (mean of the last {len(tail)}); wrote {out}")
    return log
