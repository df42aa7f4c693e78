"""When no rule decides: the nearest labelled public failures, named with their links and how
close they are, and their vote, which is weak and only used when asked for.

The texts are rows of the repository's labelled corpora (real published failures).
"""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage import nearest

CORPUS = Path(__file__).parent / "corpus"
SHIPPED = Path(nearest.__file__).parent / nearest.SHIPPED


def row(corpus: str, row_id: str) -> dict[str, object]:
    rows = [json.loads(line) for line in (CORPUS / corpus).read_text().splitlines() if line]
    return next(r for r in rows if r["id"] == row_id)


def test_the_shipped_corpus_is_built_from_the_labelled_corpora() -> None:
    corpora = sorted(CORPUS.glob("*.jsonl")) + [CORPUS / "dev" / "dev.jsonl"]
    rows = [json.loads(line) for c in corpora for line in c.read_text().splitlines() if line]
    assert json.loads(SHIPPED.read_text()) == nearest.build(rows)


def test_an_undecided_failure_names_its_nearest_labelled_public_failures_as_a_lead() -> None:
    # github.com/open-mmlab/OpenPCDet/issues/1047: torchrun's summary and nothing that says why.
    log = str(row("blind3.jsonl", "k-034")["log"])
    d = triage.classify(triage.Signals(exit_code=1, log=log))
    assert d is not None
    assert (d.rule_id, d.category, d.weak) == ("fallback.unknown", Category.UNKNOWN, True)
    assert d.nearest and d.nearest[0].source == "https://github.com/open-mmlab/OpenPCDet/issues/1047"
    assert d.nearest[0].similarity == 1.0
    assert [n.similarity for n in d.nearest] == sorted((n.similarity for n in d.nearest),
                                                       reverse=True)
    shown = d.to_dict()["nearest"][0]
    assert shown == {"source": "https://github.com/open-mmlab/OpenPCDet/issues/1047",
                     "category": "unknown", "retryable": True, "similarity": 1.0}


def test_the_neighbours_vote_only_when_asked_and_then_as_a_weak_guess() -> None:
    log = str(row("blind3.jsonl", "k-034")["log"])
    d = triage.classify(triage.Signals(exit_code=1, log=log), nearest_vote=True)
    assert d is not None
    expected = nearest.vote(nearest.nearest(log))
    assert expected is not None
    assert (d.rule_id, d.category, d.strength, d.weak) == (
        "nearest.vote", expected.category, "guess", True)
    assert expected.source in d.signature and "Weak call" in d.remediation


def test_a_decided_failure_names_no_neighbours() -> None:
    d = triage.classify(triage.Signals(log="torch.OutOfMemoryError: CUDA out of memory."))
    assert d is not None and d.category is Category.CUDA_OOM and d.nearest == ()


def test_the_vote_needs_a_majority_of_the_similarity() -> None:
    split = (nearest.Neighbour("https://github.com/a/b/issues/1", Category.CUDA_OOM, False, 0.5),
             nearest.Neighbour("https://github.com/a/b/issues/2", Category.HOST_OOM, False, 0.5))
    assert nearest.vote(split) is None
    assert nearest.vote(split[:1]) == split[0]
