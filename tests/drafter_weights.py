"""Shared by the DFlash / DSpark tests: random weights that make wiring mistakes visible, and edited copies of
a checkpoint folder for the bad-input cases."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file


def randomize_(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> torch.nn.Module:
    """Norm weights around 1, everything else N(0, 0.15), in named_parameters order (seed first); parameters
    whose names start with a `skip` prefix are left alone."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.startswith(skip):
                continue
            if "norm" in name:  # non-trivial norm weights, so a skipped or misplaced norm shows up
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    return module


def edited_checkpoint(src: Path, dst: Path, config: Callable[[dict], None] | None = None,
                      tensors: Callable[[dict], None] | None = None) -> Path:
    """A copy of checkpoint folder `src` at `dst` with config.json and/or model.safetensors edited in place."""
    shutil.copytree(src, dst)
    if config is not None:
        raw = json.loads((dst / "config.json").read_text())
        config(raw)
        (dst / "config.json").write_text(json.dumps(raw))
    if tensors is not None:
        state = load_file(str(dst / "model.safetensors"))
        tensors(state)
        save_file(state, str(dst / "model.safetensors"))
    return dst
