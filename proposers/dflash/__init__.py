"""DFlash block-diffusion drafter: the draft network, its config, checkpoint loaders (z-lab, speculators,
DeepSpec) and writer (speculators), engine-free."""

from spec_plugins.proposers.dflash.config import DFlashConfig, default_target_layer_ids
from spec_plugins.proposers.dflash.export import save_speculators
from spec_plugins.proposers.dflash.loader import load_deepspec_dflash, load_dflash, zlab_to_ours
from spec_plugins.proposers.dflash.model import DFlashDrafter, DFlashDraftModel, DraftKVCache, select_taps
from spec_plugins.proposers.dflash.proposer import DFlashProposer

__all__ = [
    "DFlashConfig", "DFlashDrafter", "DFlashDraftModel", "DFlashProposer", "DraftKVCache", "default_target_layer_ids",
    "load_deepspec_dflash", "load_dflash", "save_speculators", "select_taps", "zlab_to_ours",
]
