"""The distribution: `python -m build` makes an sdist and a wheel with the compiled cores, and the wheel works
installed on its own, with no checkout on the path.

Selected by `-m wheel` (deselect with `-m "not wheel"`); ~2-3 minutes on two cores, most of it compiling the
C++ cores once. The build runs without isolation and the fresh environment borrows this interpreter's
dependencies (numpy, pydantic, ...) through a path file instead of downloading them, so the test needs no
network; what it installs from the wheel is spec-plugins alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORES = ("spec_plugins/_contract", "spec_plugins/_ledger", "spec_plugins/vllm/_rows", "spec_plugins/policy/_trim",
         "spec_plugins/policy/_observe", "spec_plugins/proposers/suffix_tree/_core", "spec_plugins/proposers/ngram/_core")

pytestmark = pytest.mark.wheel

# Run in the fresh environment, from a folder outside the checkout.
CHECK = r"""
import importlib, json, os, sys
checkout = os.environ["CHECKOUT"]
assert checkout not in {os.path.realpath(p or os.getcwd()) for p in sys.path}, sys.path
import spec_plugins
assert os.path.realpath(spec_plugins.__file__).startswith(os.environ["VENV"]), spec_plugins.__file__
for name in ("spec_plugins._contract", "spec_plugins._ledger", "spec_plugins.vllm._rows", "spec_plugins.policy._trim",
             "spec_plugins.policy._observe", "spec_plugins.proposers.suffix_tree._core", "spec_plugins.proposers.ngram._core"):
    module = importlib.import_module(name)
    assert module.__file__.endswith(".so") and os.path.realpath(module.__file__).startswith(os.environ["VENV"])
from spec_plugins import DraftRequest
from spec_plugins.registry import available_proposers, create_proposer
tree = create_proposer("suffix_tree", {})
(draft,) = tree.propose([DraftRequest(req_id="r", tokens=[5, 6, 7, 5, 6], num_new=5, max_draft=4)])
tree.finish("r")
import importlib.resources
assert importlib.resources.files("spec_plugins.configs.hardware").joinpath("h200.yaml").is_file()
print(json.dumps({"draft": list(draft.tokens), "proposers": available_proposers()}))
"""


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_wheel_installs_and_drafts_without_the_checkout(tmp_path):
    pytest.importorskip("build", reason="the `build` package comes with the dev extra")
    pytest.importorskip("pybind11", reason="pybind11 comes with the dev extra (the build runs without isolation)")
    dist = tmp_path / "dist"
    # The sdist first, then the wheel built from the unpacked sdist: a file missing from the sdist fails here.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], timeout=1200,
         cwd=tmp_path)
    (wheel,) = dist.glob("spec_plugins-*.whl")
    (sdist,) = dist.glob("spec_plugins-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    for core in CORES:
        assert any(n.startswith(core) and n.endswith(".so") for n in names), core
    assert any(n.endswith("licenses/LICENSE") for n in names), "the license file is in the wheel's metadata"
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata and "Classifier:" in metadata
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    for needed in ("LICENSE", "proposers/suffix_tree/tree.hpp", "proposers/worker_pool.hpp",
                   "spec_plugins/copy_hazard.hpp",
                   "spec_plugins/fast_array.hpp", "spec_plugins/policy/numeric.hpp"):
        assert any(m.endswith("/" + needed) for m in members), needed

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # This interpreter's dependencies, after the fresh environment's own site-packages (so the wheel's copy of
    # spec_plugins wins; an editable install here is a finder hook that a path entry does not run).
    borrowed = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    (site / "borrowed_dependencies.pth").write_text("\n".join(borrowed or [sysconfig.get_paths()["purelib"]]) + "\n")
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], timeout=600)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(CHECKOUT=str(ROOT.resolve()), VENV=str(venv.resolve()))
    help_text = _run([str(venv / "bin" / "spec-plugins"), "--help"], cwd=outside, env=env, timeout=300).stdout
    assert "train-drafter" in help_text and "sweep" in help_text
    out = _run([str(py), "-c", CHECK], cwd=outside, env=env, timeout=300).stdout
    assert '"draft": [7, 5, 6' in out and '"suffix_tree"' in out and '"ngram"' in out
