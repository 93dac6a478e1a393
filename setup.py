"""Builds the compiled cores of the suffix-tree and n-gram proposers (and the suffix tree's test-only module), the
adaptive policy's step and the drafting contract's column checks; everything else is in pyproject.toml."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

# The suffix tree's core, by responsibility (proposers/suffix_tree/): the child map, the tree, the copier, the
# tokens appended ahead, the cache of requests and its batched step, and what both binding modules share.
SUFFIX_TREE_HEADERS = [
    f"proposers/suffix_tree/{name}.hpp" for name in ("child_map", "tree", "copier", "ahead", "cache", "binding")
] + ["proposers/worker_pool.hpp", "proposers/page_arena.hpp", "spec_plugins/copy_hazard.hpp"]
FAST_ARRAY = "spec_plugins/fast_array.hpp"
POLICY_HEADERS = ["spec_plugins/policy/numeric.hpp", FAST_ARRAY]


def core(name: str, source: str, depends: list[str]) -> Pybind11Extension:
    """One compiled module; every one is C++17 at -O3."""
    return Pybind11Extension(name, [source], depends=depends, cxx_std=17, extra_compile_args=["-O3"])


setup(
    ext_modules=[
        core("spec_plugins.proposers.suffix_tree._core", "proposers/suffix_tree/_core.cpp",
             SUFFIX_TREE_HEADERS + [FAST_ARRAY]),
        # Test-only (the tree on its own, invariant checks): a module of its own, which the proposer never loads.
        core("spec_plugins.proposers.suffix_tree._testing", "proposers/suffix_tree/_testing.cpp",
             SUFFIX_TREE_HEADERS + ["proposers/suffix_tree/check.hpp"]),
        core("spec_plugins._contract", "spec_plugins/_contract.cpp", [FAST_ARRAY]),
        core("spec_plugins._ledger", "spec_plugins/_ledger.cpp", [FAST_ARRAY]),
        core("spec_plugins.vllm._rows", "spec_plugins/vllm/_rows.cpp", [FAST_ARRAY]),
        core("spec_plugins.policy._trim", "spec_plugins/policy/_trim.cpp", POLICY_HEADERS),
        core("spec_plugins.policy._observe", "spec_plugins/policy/_observe.cpp", POLICY_HEADERS),
        core("spec_plugins.proposers.ngram._core", "proposers/ngram/_core.cpp",
             ["proposers/worker_pool.hpp", FAST_ARRAY, "spec_plugins/copy_hazard.hpp"]),
    ],
    cmdclass={"build_ext": build_ext},
)
