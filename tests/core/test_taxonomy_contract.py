"""The taxonomy is a contract: the code's categories and retry defaults are exactly the document's."""

from __future__ import annotations

import re
from pathlib import Path

from trainguard.core.taxonomy import INFO, Category

DOC = Path(__file__).resolve().parents[2] / "docs" / "failure-taxonomy.md"


def _rows() -> dict[str, bool]:
    rows = {}
    for line in DOC.read_text().splitlines():
        if match := re.match(r"^\| `([a-z_]+)` \| (yes|no)\b", line):
            rows[match.group(1)] = match.group(2) == "yes"
    return rows


def test_the_code_holds_exactly_the_documented_categories_with_their_retry_defaults() -> None:
    rows = _rows()
    assert set(rows) == {c.value for c in Category}
    assert {c.value: INFO[c].retryable for c in Category} == rows
