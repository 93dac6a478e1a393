"""The runtime never reaches up into the tools: no module an engine loads imports `spec_plugins.bench`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ["spec_plugins/policy", "spec_plugins/vllm", "spec_plugins/trtllm", "spec_plugins/drafting.py",
           "spec_plugins/core.py", "spec_plugins/registry.py", "spec_plugins/settings.py", "spec_plugins/slots.py",
           "proposers", "kernels"]


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in the file names, at any depth (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def runtime_files() -> list[Path]:
    files = []
    for entry in RUNTIME:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_runtime_modules_do_not_import_the_tools():
    files = runtime_files()
    assert len(files) > 30  # the folders are where this test looks
    offenders = {str(f.relative_to(ROOT)): sorted(m for m in imported_modules(f) if m.startswith("spec_plugins.bench"))
                 for f in files}
    assert {f: m for f, m in offenders.items() if m} == {}


def test_the_check_sees_a_lazy_import(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from spec_plugins.bench.vllm_run import Engine\n    return Engine\n")
    assert "spec_plugins.bench.vllm_run" in imported_modules(module)
