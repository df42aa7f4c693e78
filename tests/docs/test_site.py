"""The documentation site builds in strict mode, and its reference pages hold what the code holds.

`mkdocs build --strict` turns every warning into a failure: a broken link or anchor, a page left
out of the navigation, a spec field, block field or command option without a description (the
reference hooks in docs/hooks.py warn about those). The site is built once for this module.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={"PATH": str(Path(sys.executable).parent), "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent),
             "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site") / "out"
    done = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return site


def page_text(site: Path, page: str) -> str:
    """A built page's text, tags stripped, entities decoded."""
    built = site / page.removesuffix(".md").removesuffix("index") / "index.html"
    if page == "index.md":
        built = site / "index.html"
    return html.unescape(re.sub(r"<[^>]+>", "", built.read_text(encoding="utf-8")))


def nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_the_site_builds_strictly_with_every_page_of_the_navigation(site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = nav_pages(config["nav"])
    assert {"reference/spec.md", "reference/blocks.md", "reference/cli.md", "reference/taxonomy.md",
            "failure-taxonomy.md", "architecture.md"} <= set(pages)
    for page in pages:
        assert page_text(site, page).strip(), page


def test_the_reference_pages_hold_every_spec_field_block_field_command_and_category(site: Path) -> None:
    from prefect.blocks.core import Block
    from typer.main import get_command

    from trainguard.cli import app
    from trainguard.core import spec
    from trainguard.core.taxonomy import Category

    spec_page = page_text(site, "reference/spec.md")
    for model in (spec.TrainingSpec, spec.RetrySpec, spec.CategoryOverrideSpec):
        assert all(name in spec_page for name in model.model_fields), model.__name__
    assert "workdir" in spec_page and "sbatch --chdir" in spec_page

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    blocks_page = page_text(site, "reference/blocks.md")
    classes = list(hooks.block_classes())
    assert {c.__name__ for c in classes} >= {"LocalProcessBackend", "KubernetesJobBackend", "SlurmBackend",
                                             "EvidenceFolder", "S3EvidenceStore", "RetryPolicy"}
    for cls in classes:
        assert cls._block_type_slug in blocks_page
        assert all(name in blocks_page for name in cls.model_fields if name not in Block.model_fields), cls

    cli_page = page_text(site, "reference/cli.md")
    root = get_command(app)
    for name, command in root.commands.items():
        subs = getattr(command, "commands", None)
        assert all(f"{name} {sub}" in cli_page for sub in subs) if subs else name in cli_page
        assert all(opt in cli_page for p in getattr(command, "params", []) for opt in p.opts if opt.startswith("--"))

    taxonomy_page = page_text(site, "reference/taxonomy.md")
    assert all(category.value in taxonomy_page for category in Category)


def test_the_architecture_page_lists_every_import_linter_contract_of_pyproject(site: Path) -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    architecture = page_text(site, "architecture.md")
    assert "importlinter-contracts" not in architecture
    for contract in contracts:
        assert contract["name"] in architecture


def layout_rows(markdown: str) -> dict[str, str]:
    """The architecture page's layout table: each folder's row, by folder."""
    return {m[1]: m[2] for m in re.finditer(r"^\| `([^`]+)/` \| (.*) \|$", markdown, re.M)}


def unnamed_modules(folder: Path, row: str) -> list[str]:
    """The modules of ``folder`` its row leaves out, where the row names any: a row lists all, or describes."""
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row))
    modules = sorted(f.stem for f in folder.glob("*.py") if f.stem not in ("__init__", "__main__"))
    return [m for m in modules if m not in named] if named & set(modules) else []


def test_a_layout_row_that_names_its_folders_modules_names_every_one() -> None:
    rows = layout_rows((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert "trainguard/core/backends/slurm" in rows
    unnamed = {folder: left for folder, row in rows.items() if (left := unnamed_modules(ROOT / folder, row))}
    assert not unnamed, f"docs/architecture.md's layout leaves out modules: {unnamed}"
    # the rule bites: a module left out of a row that lists its folder's modules is named
    assert unnamed_modules(ROOT / "trainguard/core/backends/slurm", "`backend`, `client`") == [
        "continuation", "evidence", "job", "nodes", "supervise", "tail"]


def test_a_broken_link_an_unknown_anchor_and_a_page_left_out_of_the_navigation_fail_the_build(tmp_path: Path) -> None:
    """The strict build is not a formality: each of these three fails it, by name."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("*.py", "*.png"))
    index = docs / "index.md"
    index.write_text(index.read_text(encoding="utf-8")
                     + "\n[gone](researchers/no-such-page.md) and [nowhere](benchmarks.md#no-such-heading)\n",
                     encoding="utf-8")
    (docs / "orphan.md").write_text("# A page no one listed\n", encoding="utf-8")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.pop("hooks")  # the reference pages are generated by the hooks: leave them out, and their nav
    config["nav"] = [e for e in config["nav"] if not (isinstance(e, dict) and "Reference" in e)]
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")

    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert done.returncode != 0
    assert "researchers/no-such-page.md" in done.stderr
    assert "no-such-heading" in done.stderr
    assert "orphan.md" in done.stderr
