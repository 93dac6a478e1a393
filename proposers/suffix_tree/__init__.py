"""SuffixDecoding proposer: per-request and global suffix trees in a compiled core."""
from spec_plugins.proposers.suffix_tree.proposer import SuffixTreeProposer

__all__ = ["SuffixTreeProposer"]
