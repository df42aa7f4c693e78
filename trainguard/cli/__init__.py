"""trainguard's command line: the composition root that wires blocks, flows and the core.

Command modules register on ``app``; heavy imports (Prefect, flows) happen inside the commands
that need them, so ``trainguard classify`` starts fast and works without a Prefect server.
"""

from __future__ import annotations

from trainguard.cli import classify as _classify  # noqa: F401
from trainguard.cli import evidence as _evidence  # noqa: F401  (registers commands)
from trainguard.cli import evidence_ops as _evidence_ops  # noqa: F401
from trainguard.cli import recent as _recent  # noqa: F401
from trainguard.cli import runs as _runs  # noqa: F401
from trainguard.cli import setup as _setup  # noqa: F401
from trainguard.cli.app import app


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
