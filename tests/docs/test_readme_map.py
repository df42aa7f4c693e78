"""Every section the long README had has a home in the site, under the same heading.

The README was cut to one screen of why and how to start; what it said moved into pages by
audience. This map is the checked list of where each of its sections went, so a reader who
remembers a heading finds it, and a page that drops one fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MOVED = {
    "Two commands": "index.md",
    "Using it": "researchers/specs.md",
    "Distributed training with torchrun": "researchers/distributed.md",
    "Deployments, the UI and the safety net": "platform/prefect.md",
    "Evidence in S3": "evidence/storage.md",
    "Stops, lost runs and storage faults": "researchers/stops.md",
    "Secrets and untrusted text": "evidence/security.md",
    "What a training job can and cannot do to trainguard": "evidence/security.md",
    "On Kubernetes": "platform/kubernetes.md",
    "Multi-node attempts on Kubernetes": "platform/kubernetes.md",
    "What a training job can and cannot do on Kubernetes": "evidence/security.md",
    "At scale: a PostgreSQL-backed server and several workers": "platform/prefect.md",
    "Flows on a Kubernetes work pool": "platform/prefect.md",
    "Triage": "triage/index.md",
    "Hang forensics": "triage/hangs.md",
    "On a Slurm cluster": "platform/slurm.md",
    "Evidence from a Kubernetes attempt": "platform/kubernetes.md",
    "Fleet view": "platform/fleet.md",
    "Layout": "architecture.md",
    "Tests": "development.md",
    "Benchmarks": "benchmarks.md",
    "GPU-hours wasted by retry policy": "benchmarks.md",
}


def headings(page: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", (ROOT / "docs" / page).read_text(encoding="utf-8"), flags=re.S | re.M)
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize(("heading", "page"), sorted(MOVED.items()))
def test_each_section_of_the_old_readme_has_a_page_under_its_heading(heading: str, page: str) -> None:
    assert heading in headings(page), f"{heading!r} is not a heading of docs/{page}"



def test_the_readme_links_into_the_site_and_the_failure_taxonomy() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert "docs/failure-taxonomy.md" in linked
    assert {f"docs/{p}" for p in ("researchers/specs.md", "platform/kubernetes.md", "platform/slurm.md",
                                  "benchmarks.md", "architecture.md")} <= linked
    assert all((ROOT / link).is_file() for link in linked), sorted(l for l in linked if not (ROOT / l).is_file())


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def test_the_kubernetes_quickstart_of_the_readme_and_of_the_kubernetes_page_are_the_same_commands() -> None:
    """The site carries the README's tested Kubernetes quickstart; the two never tell different steps."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Kubernetes quickstart\n"):]
    section = section[:section.index("\n## ", 1)]
    page = (ROOT / "docs" / "platform" / "kubernetes.md").read_text(encoding="utf-8")
    in_page = page[page.index("## Kubernetes quickstart\n"):]
    in_page = in_page[:in_page.index("\n## ", 1)]
    assert fenced_blocks(section) and fenced_blocks(section) == fenced_blocks(in_page)
    markers = re.findall(r"<!-- doc-test:.*?-->", section)
    assert markers == re.findall(r"<!-- doc-test:.*?-->", in_page)
