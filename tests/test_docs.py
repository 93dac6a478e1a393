"""The documentation: the site builds with --strict (a broken link or anchor fails), the generated options
reference lists every field of every options model, the README stays short, and the results page names
what it must."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _reference():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _options_models_in_source() -> set[str]:
    """`module:Class.Options` for every nested `class Options(...BaseModel)`, and `module:Class` for every
    settings section (a subclass of ProposerSettings), found by reading the source."""
    found = set()
    for folder, package in (("spec_plugins", "spec_plugins"), ("proposers", "spec_plugins.proposers"),
                            ("kernels", "spec_plugins.kernels")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            module = ".".join((package, *parts)).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {ast.unparse(b) for b in node.bases}
                if "ProposerSettings" in bases:
                    found.add(f"{module}:{node.name}")
                for inner in node.body:
                    if isinstance(inner, ast.ClassDef) and inner.name == "Options":
                        found.add(f"{module}:{node.name}.Options")
    return found


def test_options_reference_names_every_options_model():
    listed = {path for _, path, _ in _reference().OPTION_MODELS}
    missing = _options_models_in_source() - listed
    assert not missing, f"add these to OPTION_MODELS in scripts/docs_reference.py: {sorted(missing)}"


def test_options_reference_lists_every_field_with_type_default_and_description():
    ref = _reference()
    text = ref.options_markdown()
    for heading, path, _ in ref.OPTION_MODELS:
        model = ref.resolve(path)
        section = text[text.index(f"## {heading}\n"):]
        section = section[:section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
        keys = re.findall(r"^\| `([^`]+)` \| `", section, flags=re.M)
        want = [field.alias or name for name, field in model.model_fields.items()]
        assert keys == want, f"{path}: the page lists {keys}, the model has {want}"
        for row in (r for r in section.splitlines() if r.startswith("| `")):
            assert row.count(" | ") == 3, row  # key, type, default, description: one line each


def test_cli_reference_lists_every_command_and_flag():
    from spec_plugins.cli import build_parser

    ref = _reference()
    text = ref.cli_markdown()

    def walk(parser, prog):
        for name, sub in ref._subcommands(parser).items():
            title = f"{prog} {name}"
            assert f"`{title}`" in text, title
            for action in sub._actions:
                for flag in action.option_strings:
                    if flag not in ("-h", "--help"):
                        assert f"`{flag}" in text or f", {flag}" in text, f"{title} {flag}"
            walk(sub, title)

    walk(build_parser(), "spec-plugins")


def test_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    options = (tmp_path / "site" / "reference" / "options.html").read_text()
    assert "max_cached_requests" in options and "<!-- options-reference -->" not in options  # the hook filled it
    cli = (tmp_path / "site" / "reference" / "cli.html").read_text()
    assert "train-drafter" in cli and "<!-- cli-reference -->" not in cli


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200 and len(text.encode()) <= 15_000
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in block] == [["make", "demo"], ["make", "test"]]
    for line in text.splitlines():  # no paragraphs inside table cells
        if line.startswith("| "):
            assert all(len(cell) <= 160 for cell in line.split(" | ")), line
    for target in re.findall(r"\]\(([^)#]+)", text):  # every relative link resolves in the checkout
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_results_page_names_its_sources_and_keeps_its_places():
    text = (ROOT / "docs" / "results.md").read_text()
    assert "python benchmarks/figures.py" in text
    assert "## Serving features × proposer" in text and "## vLLM versions under contract" in text
    for script in sorted((ROOT / "benchmarks").glob("*.py")):  # each remaining script is named with its command
        assert f"benchmarks/{script.name}" in text, script.name
    for image in re.findall(r"\]\((img/[^)]+)\)", text):
        assert (ROOT / "docs" / image).is_file(), image
    for path in re.findall(r"`(benchmarks/[^`*{ ]+\.(?:json|txt))`", text):  # the committed files it cites
        assert (ROOT / path).is_file(), path
