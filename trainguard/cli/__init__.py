"""trainguard's command line: the composition root that wires blocks, flows and the core.

Command modules register on ``app``; heavy imports (Prefect, flows, boto3) happen inside the
commands that need them. ``trainguard classify`` loads its own command module alone: it runs
where a log is read by the gigabyte, often in batch, and must start in a fraction of a second and
without a Prefect server.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

_COMMAND_MODULES = ("classify", "dump", "evidence", "evidence_ops", "fleet", "recent", "runs", "setup")


def _full_app() -> Any:
    """The typer application with every command registered."""
    for name in _COMMAND_MODULES:
        importlib.import_module(f"trainguard.cli.{name}")
    from trainguard.cli.typer_app import app

    return app


def main() -> None:
    """Console-script entry point."""
    if sys.argv[1:2] == ["classify"]:
        from trainguard.cli.classify import run_alone

        run_alone(sys.argv[2:])
        return
    _full_app()()


def __getattr__(name: str) -> Any:
    if name == "app":
        return _full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
