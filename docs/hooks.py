"""mkdocs hooks: the reference pages, generated from the code at every build, so they cannot drift.

`on_files` adds four pages that exist in no folder: the run spec's fields (from the pydantic models
of `trainguard.core.spec`), every block's fields (each Block class of the `blocks` package, found,
not listed), the command line (walked from the typer application's click commands) and the failure
taxonomy (from its contract, `trainguard.core.taxonomy`). A field or command without a description
is a warning, which `mkdocs build --strict` (and the test that runs it) turns into a failure.
The architecture page's list of layering contracts is read from `pyproject.toml` the same way
(`on_page_markdown`). Nothing here belongs to the product: it is imported by mkdocs only.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import logging
import pkgutil
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

log = logging.getLogger("mkdocs.hooks.reference")

GENERATED_NOTE = "*Generated from the code at every build of this site: edit the code, not this page.*\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Adds the generated reference pages to the site."""
    pages = {
        "reference/spec.md": spec_page,
        "reference/blocks.md": blocks_page,
        "reference/cli.md": cli_page,
        "reference/taxonomy.md": taxonomy_page,
    }
    for uri, make in pages.items():
        files.append(File.generated(config, uri, content=make()))
    return files


CONTRACTS_MARK = "<!-- importlinter-contracts -->"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Puts the import-linter contracts of `pyproject.toml` where a page asks for them."""
    if CONTRACTS_MARK not in markdown:
        return markdown
    pyproject = Path(config.config_file_path).parent / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    return markdown.replace(CONTRACTS_MARK, "\n".join(contract_item(c) for c in contracts))


def contract_item(contract: dict[str, Any]) -> str:
    """One contract as a list item: its name, then what it holds to."""
    names = lambda key: ", ".join(f"`{m}`" for m in contract.get(key, []))  # noqa: E731
    kind = contract["type"]
    if kind == "layers":
        detail = "layers, top to bottom: " + " → ".join(f"`{m}`" for m in contract["layers"])
    elif kind == "forbidden":
        detail = f"{names('source_modules')} never import {names('forbidden_modules')}"
        if contract.get("ignore_imports"):
            detail += f" (except {names('ignore_imports')})"
    elif kind == "independence":
        detail = f"independent of each other: {names('modules')}"
    else:
        log.warning("the import-linter contract %r is of a type this page does not describe: %s", contract["name"], kind)
        detail = kind
    return f"- **{contract['name']}**: {detail}."


# ---- shared: a pydantic model's fields as a table


def md_cell(text: object) -> str:
    """One table cell: pipes escaped, lines joined."""
    return " ".join(str(text).split()).replace("|", "\\|")


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `int | None`, `list[str]`, `fixed or exponential`."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(f"`{m.value}`" for m in annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a).strip("`") for a in typing.get_args(annotation))
        return f"`{getattr(origin, '__name__', str(origin))}[{args}]`"
    if annotation is type(None):
        return "`null`"
    if annotation is SecretStr:
        return "secret string"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


def default_of(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or value == {} or value == []:
        return "empty" if value is None else f"`{value!r}`"
    return f"`{value!r}`" if not isinstance(value, BaseModel) else "defaults"


def limits_of(field: FieldInfo) -> str:
    words = {annotated_types.Ge: "≥", annotated_types.Gt: ">", annotated_types.Le: "≤", annotated_types.Lt: "<"}
    parts = []
    for meta in field.metadata:
        for kind, sign in words.items():
            if isinstance(meta, kind):
                parts.append(f"{sign} {getattr(meta, kind.__name__.lower())}")
        if isinstance(meta, annotated_types.MinLen):
            parts.append(f"at least {meta.min_length} item(s)")
    return ", ".join(parts)


def fields_table(owner: str, fields: dict[str, FieldInfo], skip: frozenset[str] = frozenset()) -> list[str]:
    rows = ["| field | type | default | limits | what it is |", "|---|---|---|---|---|"]
    for name, field in fields.items():
        if name in skip or name.startswith("_"):
            continue
        about = " ".join(p for p in (field.title and f"**{field.title}.**", field.description) if p)
        if not field.description:
            log.warning("%s.%s has no description: the reference page cannot say what it is", owner, name)
        rows.append(f"| `{name}` | {md_cell(type_name(field.annotation))} | {md_cell(default_of(field))} "
                    f"| {md_cell(limits_of(field))} | {md_cell(about)} |")
    return rows


def first_paragraph(obj: object) -> str:
    return (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ")


# ---- the run spec


def spec_page() -> str:
    from trainguard.core import spec

    lines = ["# Run spec reference", "", GENERATED_NOTE,
             "A run spec is YAML (or JSON) validated by `trainguard.core.spec.TrainingSpec`; a bad one gets one",
             "line naming the field and the fix, and nothing is written. How to write one for your own script:",
             "[Run your training script](../researchers/specs.md).", ""]
    for model in (spec.TrainingSpec, spec.RetrySpec, spec.CategoryOverrideSpec):
        title = {"TrainingSpec": "The spec", "RetrySpec": "`retry`",
                 "CategoryOverrideSpec": "`retry.overrides.<category>`"}[model.__name__]
        lines += [f"## {title}", "", first_paragraph(model), "", *fields_table(model.__name__, model.model_fields), ""]
    return "\n".join(lines)


# ---- blocks


def block_classes() -> Iterator[type]:
    """Every Block class defined in the `blocks` package, in module order."""
    import blocks

    for info in pkgutil.iter_modules(blocks.__path__):
        module = importlib.import_module(f"blocks.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "_block_type_slug" in vars(cls):
                yield cls


def blocks_page() -> str:
    from prefect.blocks.core import Block

    lines = ["# Blocks reference", "", GENERATED_NOTE,
             "Blocks hold the configuration a platform engineer edits in the Prefect UI (or saves from",
             "Python); flows load them by reference (`slug/name`) when a run starts. Register their types",
             "with `trainguard setup`.", ""]
    base_fields = frozenset(Block.model_fields)
    for cls in block_classes():
        lines += [f"## {cls._block_type_name}", "",  # type: ignore[attr-defined]
                  f"Slug `{cls._block_type_slug}`; from Python `from {cls.__module__} import {cls.__name__}`.",  # type: ignore[attr-defined]
                  "", first_paragraph(cls), "", *fields_table(cls.__name__, cls.model_fields, base_fields), ""]
    return "\n".join(lines)


# ---- the command line


def cli_page() -> str:
    import typer

    from trainguard.cli import app

    root = typer.main.get_command(app)
    lines = ["# Command-line reference", "", GENERATED_NOTE,
             "`./dev <command>` runs `trainguard <command>` from the checkout's `.venv`; an installed",
             "trainguard is the `trainguard` command itself.", ""]
    lines += list(command_sections(root, ["trainguard"]))
    return "\n".join(lines)


def command_sections(command: Any, path: list[str]) -> Iterator[str]:
    """A section per command, groups walked (typer carries its own copy of click: duck-typed here)."""
    if hasattr(command, "commands"):
        for name in sorted(command.commands):
            yield from command_sections(command.commands[name], [*path, name])
        return
    if not command.help:
        log.warning("the command %r has no help text", " ".join(path))
    ctx = command.context_class(command, info_name=" ".join(path))
    yield f"## `{' '.join(path[1:])}`"
    yield ""
    yield f"```\n{command.get_usage(ctx)}\n```"
    yield ""
    yield inspect.cleandoc(command.help or "").replace("\b\n", "")
    yield ""
    params = [p for p in command.params if p.name != "help" and not getattr(p, "hidden", False)]
    if params:
        yield "| argument or option | type | default | what it does |"
        yield "|---|---|---|---|"
        for param in params:
            yield param_row(" ".join(path), param)
    yield ""


def param_row(command: str, param: Any) -> str:
    option = hasattr(param, "is_flag")
    names = ", ".join(f"`{n}`" for n in (*param.opts, *param.secondary_opts))
    helptext = getattr(param, "help", None) or ""
    if option and not helptext:
        log.warning("%s: the option %s has no help text", command, param.opts[0])
    if not option:
        names = f"`{(param.metavar or param.name).upper()}`" + ("" if param.required else " (optional)")
    default = param.default
    shown = "" if default in (None, (), False) or callable(default) else f"`{default}`"
    descriptor = getattr(param, "type_descriptor", None)
    kind = "flag" if option and param.is_flag else type_name(descriptor.annotation) if descriptor else ""
    return f"| {names} | {md_cell(kind)} | {md_cell(shown)} | {md_cell(helptext)} |"


# ---- the taxonomy


def taxonomy_page() -> str:
    from trainguard.core import taxonomy

    lines = ["# Failure taxonomy reference", "", GENERATED_NOTE,
             "The ids below are a contract: the classifier, `trainguard classify --json`, Prefect events, reports",
             "and the evaluation corpora use these strings. What each category is and its typical evidence:",
             "[the failure taxonomy](../failure-taxonomy.md); how a verdict is reached: [Triage](../triage/index.md).",
             "", "| id | retried by default | next attempt avoids the node | what to do |", "|---|---|---|---|"]
    for category in taxonomy.Category:
        info = taxonomy.INFO[category]
        lines.append(f"| `{category.value}` | {'yes' if info.retryable else 'no'} "
                     f"| {'yes' if info.avoid_node else 'no'} | {md_cell(info.remediation)} |")
    return "\n".join(lines) + "\n"
