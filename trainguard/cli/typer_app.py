"""The typer application object that every command module registers itself on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="trainguard",
    help="Run GPU training so that a failure costs minutes: triage, evidence, checkpoint-aware retries.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
