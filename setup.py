"""Builds the compiled cores of the suffix-tree and n-gram proposers (and the suffix tree's test-only module), the
adaptive policy's step and the drafting contract's column checks; everything else is in pyproject.toml."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

# The suffix tree's core, by responsibility (proposers/suffix_tree/): the child map, the tree, the copier, the
# tokens appended ahead, the cache of requests and its batched step, and what both binding modules share.
SUFFIX_TREE_HEADERS = [
    f"proposers/suffix_tree/{name}.hpp" for name in ("child_map", "tree", "copier", "ahead", "cache", "binding")
] + ["proposers/worker_pool.hpp", "proposers/page_arena.hpp", "spec_plugins/copy_hazard.hpp"]

setup(
    ext_modules=[
        Pybind11Extension(
            "spec_plugins.proposers.suffix_tree._core",
            ["proposers/suffix_tree/_core.cpp"],
            depends=SUFFIX_TREE_HEADERS + ["spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        # Test-only (the tree on its own, invariant checks): a module of its own, which the proposer never loads.
        Pybind11Extension(
            "spec_plugins.proposers.suffix_tree._testing",
            ["proposers/suffix_tree/_testing.cpp"],
            depends=SUFFIX_TREE_HEADERS + ["proposers/suffix_tree/check.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins._contract",
            ["spec_plugins/_contract.cpp"],
            depends=["spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins._ledger",
            ["spec_plugins/_ledger.cpp"],
            depends=["spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins.vllm._rows",
            ["spec_plugins/vllm/_rows.cpp"],
            depends=["spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins.policy._trim",
            ["spec_plugins/policy/_trim.cpp"],
            depends=["spec_plugins/policy/numeric.hpp", "spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins.policy._observe",
            ["spec_plugins/policy/_observe.cpp"],
            depends=["spec_plugins/policy/numeric.hpp", "spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins.proposers.ngram._core",
            ["proposers/ngram/_core.cpp"],
            depends=["proposers/worker_pool.hpp", "spec_plugins/fast_array.hpp", "spec_plugins/copy_hazard.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
    ],
    cmdclass={"build_ext": build_ext},
)
