"""The documentation's reference pages, generated from the code when the site is built (a MkDocs hook).

`docs/reference/options.md` holds `<!-- options-reference -->`: every key of every options model (the engines'
`spec_plugins` sections, each proposer's and policy's `Options`, the hardware profile files) with its type,
default and description, read from the pydantic models themselves. `docs/reference/cli.md` holds
`<!-- cli-reference -->`: every `spec-plugins` command and flag, read from the argparse parsers of
`spec_plugins/cli.py`. Generated at build time so the pages cannot drift from the code; tests/test_docs.py
checks that the list below names every options model in the source.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from typing import Any

# (heading, "module:Class[.Options]", where the keys are written)
OPTION_MODELS: list[tuple[str, str, str]] = [
    ("vLLM 0.34: `speculative_config.speculator_options`", "spec_plugins.vllm.settings:Mrv2Settings",
     "`vllm serve ... --speculative-config '{\"method\": \"spec_plugins_suffix_tree\", ..., "
     "\"speculator_options\": {...}}'` (`proposer` is the method's own)"),
    ("vLLM 0.32 / 0.33: `additional_config.spec_plugins`", "spec_plugins.vllm.settings:VllmSettings",
     "`vllm serve ... --additional-config '{\"spec_plugins\": {...}}'`, or `LLM(additional_config=...)`"),
    ("TensorRT-LLM: the `spec_plugins:` section", "spec_plugins.trtllm.settings:Settings",
     "the LLM-API YAML given to `spec-plugins trtllm serve --config`"),
    ("Proposer `suffix_tree`", "spec_plugins.proposers.suffix_tree.proposer:SuffixTreeProposer.Options",
     "`proposer_options` with `\"proposer\": \"suffix_tree\"`"),
    ("Proposer `ngram`", "spec_plugins.proposers.ngram.proposer:NgramProposer.Options",
     "`proposer_options` with `\"proposer\": \"ngram\"`"),
    ("Proposer `fixed_draft` (profiling only)", "spec_plugins.proposers.fixed_draft.proposer:FixedDraftProposer.Options",
     "`proposer_options` with `\"proposer\": \"fixed_draft\"` (`spec-plugins profile` uses it)"),
    ("Policy `fixed`", "spec_plugins.core:FixedLength.Options", "`policy_options` with `\"policy\": \"fixed\"`"),
    ("Policy `adaptive`", "spec_plugins.policy.adaptive:AdaptiveLength.Options",
     "`policy_options` with `\"policy\": \"adaptive\"`"),
    ("Measured step-time cost", "spec_plugins.policy.measured:MeasuredCost.Options",
     "`MeasuredCost(profile, ...)`; the adaptive policy passes its own `draft_us_per_request`"),
    ("Hardware profile files", "spec_plugins.policy.hardware:HardwareProfile",
     "`configs/hardware/*.yaml`, or your own YAML given as `hardware: PATH`"),
    ("Replay baseline `arctic` (benchmarks only)", "spec_plugins.bench.baselines:ArcticSuffix.Options",
     "`python -m spec_plugins.bench.replay --options 'arctic={...}'`"),
    ("Replay baseline `vllm_ngram` (benchmarks only)", "spec_plugins.bench.baselines:VllmNgram.Options",
     "`python -m spec_plugins.bench.replay --options 'vllm_ngram={...}'`"),
    ("Replay baseline `vllm034_suffix_np`: the project's replay of vLLM 0.34's `suffix` (benchmarks only)",
     "spec_plugins.bench.vllm034_suffix_np:Vllm034SuffixReplay.Options",
     "`python -m spec_plugins.bench.replay --options 'vllm034_suffix_np={...}'`"),
    ("Replay baseline `vllm034_ngram_np`: the project's replay of vLLM 0.34's GPU `ngram` (benchmarks only)",
     "spec_plugins.bench.vllm034_suffix_np:Vllm034NgramReplay.Options",
     "`python -m spec_plugins.bench.replay --options 'vllm034_ngram_np={...}'`"),
    ("Replay baseline `vllm034_ngram`: vLLM 0.34's own `ngram` kernels, interpreted (benchmarks only)",
     "spec_plugins.bench.vllm034_suffix:Vllm034Ngram.Options",
     "`CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 .venv-vllm034/bin/python -m spec_plugins.bench.replay --options "
     "'vllm034_ngram={...}'`"),
    ("Replay baseline `vllm034_suffix`: vLLM 0.34's own `suffix` kernels, interpreted (benchmarks only)",
     "spec_plugins.bench.vllm034_suffix:Vllm034Suffix.Options",
     "`CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 .venv-vllm034/bin/python -m spec_plugins.bench.replay --options "
     "'vllm034_suffix={...}'`"),
    ("Replay candidate `suffix_tree_continued` (benchmarks only; no options)",
     "spec_plugins.bench.baselines:ContinuedSuffixTree.Options",
     "`python -m spec_plugins.bench.replay --proposers suffix_tree,suffix_tree_continued --accounting mrv2`"),
]


def resolve(path: str) -> Any:
    module, qualname = path.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _cell(text: Any) -> str:
    """One table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return re.sub(r"\btyping\.", "", text).replace("NoneType", "None")


def _source_comment(model: type, name: str) -> str:
    """The comment on a field's line, or the comment lines right above it: where the source explains a field
    that has no `description`."""
    for cls in model.__mro__:  # an inherited field is explained where it is declared
        if name in getattr(cls, "__annotations__", {}):
            found = _comment_in(cls, name)
            if found:
                return found
    return ""


def _comment_in(cls: type, name: str) -> str:
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return ""
    for i, line in enumerate(lines):
        if re.match(rf"\s+{re.escape(name)}\s*:", line):
            trailing = line.split("#", 1)[1].strip() if "#" in line and '"' not in line.split("#", 1)[1] else ""
            if trailing:
                return trailing
            above = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                above.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            return " ".join(above)
    return ""


def field_rows(model: type) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every field, the key as the user writes it (its alias)."""
    import pydantic_core

    rows = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if field.default_factory is not None:
            default = repr(field.default_factory())
        elif field.default is pydantic_core.PydanticUndefined:
            default = "required"
        else:
            default = repr(field.default)
        bounds = [f"{op} {v}" for op, attr in ((">=", "ge"), (">", "gt"), ("<=", "le"), ("<", "lt"))
                  for m in field.metadata if (v := getattr(m, attr, None)) is not None]
        kind = _type_name(field.annotation) + (f" ({', '.join(bounds)})" if bounds else "")
        rows.append((key, kind, default, field.description or _source_comment(model, name)))
    return rows


def options_markdown() -> str:
    out = []
    for heading, path, where in OPTION_MODELS:
        model = resolve(path)
        out += [f"## {heading}", "", f"Where: {where}. Model: `{path}`.", "",
                "| key | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{k}` | `{_cell(t)}` | `{_cell(d)}` | {_cell(desc) or '-'} |" for k, t, d, desc in field_rows(model)]
        out.append("")
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | help |", "|---|---|---|"]
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(a.option_strings) or a.dest
        if a.choices and not a.option_strings:
            name += " {" + ",".join(map(str, a.choices)) + "}"
        default = "" if a.default in (None, argparse.SUPPRESS) or a.required else f"`{_cell(repr(a.default))}`"
        if a.required:
            default = "required"
        rows.append(f"| `{_cell(name)}` | {default} | {_cell(_help(a, parser.prog)) or '-'} |")
    return rows if len(rows) > 2 else []


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as argparse prints it (`%(default)s` filled in, `%%` as `%`)."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    try:
        return action.help % dict(params, prog=prog)
    except (KeyError, TypeError, ValueError):
        return action.help


def cli_markdown(parser: argparse.ArgumentParser | None = None, prog: str = "spec-plugins", depth: int = 2) -> str:
    if parser is None:
        from spec_plugins.cli import build_parser

        parser = build_parser()
    out = []
    for name, sub in _subcommands(parser).items():
        title = f"{prog} {name}"
        out += [f"{'#' * depth} `{title}`", ""]
        if sub.description:
            out += [sub.description.strip().split("\n\n")[0].replace("\n", " "), ""]
        out += ["```text", sub.format_usage().strip(), "```", ""]
        out += _flags_table(sub)
        out.append("")
        out.append(cli_markdown(sub, title, min(depth + 1, 4)))
    return "\n".join(out)


PLACEHOLDERS = {"<!-- options-reference -->": options_markdown, "<!-- cli-reference -->": cli_markdown}


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    """MkDocs hook: fill the placeholders of the reference pages."""
    for marker, generate in PLACEHOLDERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
