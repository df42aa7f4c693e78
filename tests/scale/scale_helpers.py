"""What the scale tests share: where the project is, its work pool, tiny specs and lineage queries."""

from __future__ import annotations

from pathlib import Path

from runs import attempt_runs, tiny_spec  # noqa: F401  (re-exported for the tests here)

ROOT = Path(__file__).resolve().parents[2]
POOL = "trainguard-local"  # the process work pool prefect.yaml names



