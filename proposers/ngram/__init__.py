from spec_plugins.proposers.ngram.proposer import NgramProposer

__all__ = ["NgramProposer"]
