"""Builds the compiled cores of the suffix-tree and n-gram proposers, the adaptive policy's step and the drafting
contract's column checks; everything else is in pyproject.toml."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

setup(
    ext_modules=[
        Pybind11Extension(
            "spec_plugins.proposers.suffix_tree._core",
            ["proposers/suffix_tree/_core.cpp"],
            depends=["proposers/suffix_tree/suffix_tree.hpp", "proposers/worker_pool.hpp", "proposers/page_arena.hpp",
                     "spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins._columns",
            ["spec_plugins/_columns.cpp"],
            depends=["spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
        Pybind11Extension(
            "spec_plugins.policy._walk",
            ["spec_plugins/policy/_walk.cpp"],
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
            depends=["proposers/worker_pool.hpp", "spec_plugins/fast_array.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
    ],
    cmdclass={"build_ext": build_ext},
)
