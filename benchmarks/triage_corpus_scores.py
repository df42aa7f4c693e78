"""Triage accuracy on labelled corpora: retry decision, category, unknown rate, weak calls.

Each corpus is a JSON Lines file of real, labelled failures (``tests/triage/corpus``); every row is
judged through ``trainguard classify --jsonl`` as other tools call it, and the misses are listed
with the rule that decided. The blind set of fresh public reports lives in
``tests/triage/corpus/fresh/`` (``dev.jsonl`` and a held-out ``holdout.jsonl``).

    .venv/bin/python benchmarks/triage_corpus_scores.py                       # every corpus
    .venv/bin/python benchmarks/triage_corpus_scores.py tests/triage/corpus/fresh/dev.jsonl -v
    .venv/bin/python benchmarks/triage_corpus_scores.py --nearest-vote tests/triage/corpus/fresh/*.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO / "tests" / "triage" / "corpus"


def judge(corpus: Path, vote: bool = False,
          ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The corpus's rows and the batch CLI's verdict on each (``vote``: with --nearest-vote)."""
    rows = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", "from trainguard.cli import main; main()", "classify", "--jsonl", "-",
         *(["--nearest-vote"] if vote else [])],
        input=corpus.read_bytes(), capture_output=True, cwd=REPO, env=env, timeout=600, check=True)
    return rows, [json.loads(line) for line in done.stdout.decode().splitlines()]


def scores(rows: list[dict[str, object]], results: list[dict[str, object]]) -> dict[str, float]:
    """Retry and category accuracy, the unknown rate and the weak-call rate."""
    n = len(rows)
    return {
        "rows": n,
        "retry": sum(g["retryable"] == r["retryable"] for r, g in zip(rows, results, strict=True)) / n,
        "category": sum(g["category"] == r["category"] for r, g in zip(rows, results, strict=True)) / n,
        "unknown": sum(g["category"] == "unknown" for g in results) / n,
        "weak": sum(bool(g.get("weak")) for g in results) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", type=Path)
    parser.add_argument("-v", "--verbose", action="store_true", help="list every miss")
    parser.add_argument("--nearest-vote", action="store_true",
                        help="let the nearest labelled failures vote when no rule decides")
    args = parser.parse_args()
    corpora = args.corpora or sorted(CORPORA.glob("**/*.jsonl"))
    for corpus in corpora:
        rows, results = judge(corpus, args.nearest_vote)
        s = scores(rows, results)
        name = corpus.resolve().relative_to(REPO) if corpus.resolve().is_relative_to(REPO) else corpus
        print(f"{name}: {s['rows']} rows, "
              f"retry {s['retry']:.3f}, category {s['category']:.3f}, unknown {s['unknown']:.3f}, "
              f"weak {s['weak']:.3f}")
        if args.verbose:
            for row, got in zip(rows, results, strict=True):
                if got["category"] != row["category"] or got["retryable"] != row["retryable"]:
                    print(f"  MISS {row['id']} {row['source']}: expected {row['category']}/"
                          f"{row['retryable']}, got {got['category']}/{got['retryable']} by "
                          f"{got['rule_id']}{' (weak)' if got.get('weak') else ''}")


if __name__ == "__main__":
    main()
