"""The labelled public failures nearest to an attempt no rule decided: a lead, and a weak vote.

trainguard ships a small corpus of real failures, each with the public report it came from, its
category and whether a retry helped (``labelled.json``, built by ``build`` from the test corpora
under ``tests/triage/corpus``). When no rule decides, the verdict names the nearest of them with
their links and how close they are, so a person has a lead ("looks like pytorch/pytorch#NNNN").

Closeness is the Jaccard similarity of the words and word pairs of the lines that carry an error
(error, failed, denied, killed, ...; the last lines when none does), with numbers, hex ids and
paths taken out so the same failure on another machine reads the same. The neighbours can also
vote, weakly, when no rule decides (``vote``); whether the vote is used is the caller's choice,
and it is off unless asked for: on the blind set of fresh public reports it did not help.

Rebuild the shipped corpus after changing the test corpora::

    .venv/bin/python -c "from trainguard.core.triage import nearest; nearest.write_shipped()"
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from trainguard.core.taxonomy import Category

__all__ = ["Neighbour", "build", "evidence_lines", "nearest", "vote", "write_shipped"]

SHIPPED = "labelled.json"
MIN_SIMILARITY = 0.12  # below this, two failures share little more than words every log prints
SHOWN = 3  # neighbours named in a verdict
KEPT_LINES = 6  # error lines kept per labelled failure
KEPT_CHARS = 400  # per line

_ERRORISH = re.compile(
    r"(?i)error|fail|exception|killed|denied|refused|unable|cannot|can't|invalid|not (?:found|"
    r"available|supported|allowed)|abort|fatal|timed? ?out|exceed|terminated|signal|violat|"
    r"unsupported|insufficient|exhausted|no such|unexpected|lost|mismatch|crash")
_NOISE = re.compile(
    r"0x[0-9a-f]+|\b[0-9a-f]{8,}\b|(?:[a-z]:)?[\\/](?:[\w.@+-]+[\\/])+[\w.@+-]*|\d+(?:[.:]\d+)*",
    re.IGNORECASE)
_WORD = re.compile(r"[a-z_][a-z_]{2,}")


@dataclass(frozen=True)
class Neighbour:
    """A labelled public failure near the attempt.

    Attributes:
        source: The public report it came from (a link).
        category: Its labelled category.
        retryable: Whether its label says a retry helps.
        similarity: How close it is, 0 to 1 (Jaccard similarity of the error lines' words).
    """

    source: str
    category: Category
    retryable: bool
    similarity: float

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "category": self.category.value,
                "retryable": self.retryable, "similarity": round(self.similarity, 3)}


def evidence_lines(text: str) -> list[str]:
    """The lines of a log that carry an error; its last lines when none does."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errorish = [line for line in lines if _ERRORISH.search(line)]
    return (errorish or lines)[-KEPT_LINES:]


def features(lines: Iterable[str]) -> frozenset[str]:
    """The words and adjacent word pairs of the lines, numbers, ids and paths left out."""
    out: set[str] = set()
    for line in lines:
        words = _WORD.findall(_NOISE.sub(" ", line[:KEPT_CHARS].lower()))
        out.update(words)
        out.update(f"{a} {b}" for a, b in zip(words, words[1:]))
    return frozenset(out)


def build(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The shipped corpus's entries for labelled rows (source, category, retryable, log): rows
    without a public link or a log are left out."""
    out = []
    for row in rows:
        source, log = row.get("source"), row.get("log")
        if not isinstance(source, str) or not source.startswith("https://") or not log:
            continue
        out.append({"source": source, "category": row["category"],
                    "retryable": bool(row["retryable"]),
                    "lines": [line[:KEPT_CHARS] for line in evidence_lines(str(log))]})
    return out


def write_shipped(corpora: Sequence[Path] | None = None) -> Path:
    """Rebuild ``labelled.json`` from the test corpora (run from the repository)."""
    here = Path(__file__).parent
    if corpora is None:
        root = here.parents[2] / "tests" / "triage" / "corpus"
        corpora = sorted(root.glob("*.jsonl")) + [root / "dev" / "dev.jsonl"]
    rows = [json.loads(line) for corpus in corpora
            for line in corpus.read_text("utf-8").splitlines() if line.strip()]
    target = here / SHIPPED
    target.write_text(json.dumps(build(rows), ensure_ascii=False, indent=0) + "\n", "utf-8")
    return target


@lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[str, Category, bool, frozenset[str]], ...]:
    text = resources.files("trainguard.core.triage").joinpath(SHIPPED).read_text("utf-8")
    return tuple((e["source"], Category(e["category"]), bool(e["retryable"]), features(e["lines"]))
                 for e in json.loads(text))


def nearest(text: str, limit: int = SHOWN) -> tuple[Neighbour, ...]:
    """The labelled failures most like the log text, closest first, at least MIN_SIMILARITY."""
    mine = features(evidence_lines(text))
    if not mine:
        return ()
    scored = []
    for source, category, retryable, theirs in _shipped():
        union = len(mine | theirs)
        similarity = len(mine & theirs) / union if union else 0.0
        if similarity >= MIN_SIMILARITY:
            scored.append(Neighbour(source, category, retryable, similarity))
    scored.sort(key=lambda n: (-n.similarity, n.source))
    return tuple(scored[:limit])


def vote(neighbours: Sequence[Neighbour]) -> Neighbour | None:
    """The neighbours' weak vote: the category with the most similarity behind it, when it has
    more than half of it; the closest neighbour of that category carries it."""
    if not neighbours:
        return None
    weight: dict[Category, float] = {}
    for n in neighbours:
        weight[n.category] = weight.get(n.category, 0.0) + n.similarity
    best = max(weight, key=lambda c: weight[c])
    if weight[best] <= sum(weight.values()) / 2:
        return None
    return next(n for n in neighbours if n.category is best)
