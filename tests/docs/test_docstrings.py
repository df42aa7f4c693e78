"""Module docstrings name modules that exist, and a package's map of its modules leaves none out.

A docstring that says "the commands are ``slurm``'s" after `slurm.py` became `slurm/client.py`
sends a reader to a file that is not there. The forms a docstring names a module in are checked:
a dotted path from a project package (`trainguard.core.backends.base.Backend`), a file name
(`report.py`, `backends/kubernetes/api.py`), a bare name in double backticks (``store``: a module
of the package or above it, or a name the module itself defines) and, in a package's docstring,
a bare name in backticks (a submodule or a name the package defines).
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainguard.core.taxonomy import Category

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainguard", "trainguard_entrypoint", "flows", "tasks", "blocks", "deployments")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]

    @property
    def docstring(self) -> str:
        return ast.get_docstring(self.tree) or ""


def _modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8")))
    return found


MODULES = _modules()
TAXONOMY_IDS = {c.value for c in Category}


def _top_level_names(module: Module) -> set[str]:
    names = set()
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _own_names(module: Module) -> set[str]:
    """Every name the module's code binds or uses, and every word of its strings after the docstring.

    Names bound only as import aliases (`evidence as slurm_evidence`) are left out: they are how a
    moved module's old name lives on in code, which is no reason for a docstring to keep it.
    """
    aliases = {a.asname for n in ast.walk(module.tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in n.names if a.asname}
    names: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.name.rpartition(".")[2] for a in node.names if not a.asname)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node is not _docstring_node(module):
            names.update(re.findall(r"\w+", node.value))
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names - aliases


def _docstring_node(module: Module) -> ast.AST | None:
    first = module.tree.body[0] if module.tree.body else None
    return first.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None


def _ancestors(package: str) -> list[str]:
    chain = []
    while package:
        chain.append(package)
        package = package.rpartition(".")[0]
    return chain


def _submodules(package: str) -> set[str]:
    prefix = package + "."
    return {n.removeprefix(prefix) for n in MODULES if n.startswith(prefix) and "." not in n.removeprefix(prefix)}


def _dangling_dotted(module: Module) -> list[str]:
    """Dotted names from a project package whose module, or whose first name in it, does not exist."""
    dangling = []
    for token in re.findall(r"`+([A-Za-z_][\w.]*)`+", module.docstring):
        parts = token.split(".")
        if parts[0] not in PACKAGES or len(parts) < 2:
            continue
        longest = max((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in MODULES), default=0)
        target = MODULES[".".join(parts[:longest])]
        rest = parts[longest:]
        if rest and rest[0] not in _top_level_names(target) | _own_names(target) and ".".join(parts[:2]) in MODULES:
            dangling.append(token)
    return dangling


def _dangling_files(module: Module) -> list[str]:
    dangling = []
    for token in re.findall(r"`+([\w./]+\.py)`+", module.docstring):
        bases = [module.path.parent, *module.path.parent.parents]
        if not any((base / token).is_file() for base in bases if ROOT in (base, *base.parents)):
            dangling.append(token)
    return dangling


def _dangling_double_backticked(module: Module) -> list[str]:
    """Bare lower-case names in double backticks that are neither a module nor anything the module knows.

    Such a name is a module of the package or above it (``store``), or a name the package's code
    knows (a parameter, a field, a word its messages print), a taxonomy id, a keyword, a builtin, a
    system call of `os`, or an importable module.
    """
    known = set().union(*(_own_names(MODULES[f"{module.package}.{s}"]) for s in _submodules(module.package)),
                        _own_names(module), TAXONOMY_IDS, keyword.kwlist, dir(builtins), dir(os))
    dangling = []
    for token in re.findall(r"``([a-z_][a-z0-9_]*)``", module.docstring):
        if any(f"{a}.{token}" in MODULES for a in _ancestors(module.package)) or token in known:
            continue
        if importlib.util.find_spec(token) is not None:
            continue
        dangling.append(token)
    return dangling


def _dangling_in_package_map(module: Module) -> list[str]:
    if module.path.name != "__init__.py":
        return []
    allowed = _submodules(module.name) | _own_names(module) | _top_level_names(module) | set(dir(builtins)) | {
        name for sub in _submodules(module.name) for name in _top_level_names(MODULES[f"{module.name}.{sub}"])}
    return [t for t in re.findall(r"(?<!`)`([a-z_][a-z0-9_]*)`(?!`)", module.docstring)
            if t not in allowed and importlib.util.find_spec(t) is None]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_a_docstring_names_exists(name: str) -> None:
    module = MODULES[name]
    dangling = (_dangling_dotted(module) + _dangling_files(module) + _dangling_double_backticked(module)
                + _dangling_in_package_map(module))
    assert not dangling, f"{module.path.relative_to(ROOT)}'s docstring names what does not exist: {dangling}"


MAPPED_PACKAGES = sorted(
    name for name, m in MODULES.items()
    if m.path.name == "__init__.py"
    and len(set(re.findall(r"`([a-z_][a-z0-9_]*)`", m.docstring)) & _submodules(name)) >= 2
)


def test_the_package_maps_cover_the_packages_that_have_them() -> None:
    """The maps this file holds to completeness; a package that starts mapping its modules joins them."""
    assert {"trainguard.core.backends", "trainguard.core.backends.kubernetes", "trainguard.core.backends.slurm",
            "trainguard.core.stores.s3", "trainguard.core.evidence"} <= set(MAPPED_PACKAGES)


@pytest.mark.parametrize("name", MAPPED_PACKAGES)
def test_a_package_docstring_that_maps_its_modules_names_every_one(name: str) -> None:
    named = set(re.findall(r"`([a-z_][a-z0-9_]*)`", MODULES[name].docstring))
    missing = sorted(_submodules(name) - named)
    assert not missing, f"{MODULES[name].path.relative_to(ROOT)} maps its modules but leaves out {missing}"


def test_the_check_finds_a_module_that_moved() -> None:
    """A docstring naming a module that moved away is caught in each form, not passed over."""
    stale = Module("trainguard.core.backends.slurm.job", ROOT / "trainguard/core/backends/slurm/job.py", ast.parse(
        '"""Commands are ``slurm_client``\'s; see `trainguard.core.slurm_backend.run`, `slurm_job.py`."""\n'))
    assert _dangling_double_backticked(stale) == ["slurm_client"]
    assert _dangling_dotted(stale) == ["trainguard.core.slurm_backend.run"]
    assert _dangling_files(stale) == ["slurm_job.py"]
    package = Module("trainguard.core.backends.local", ROOT / "trainguard/core/backends/local/__init__.py",
                     ast.parse('"""`backend` and `runner`, and `local_backend`."""\n'))
    assert _dangling_in_package_map(package) == ["local_backend"]
