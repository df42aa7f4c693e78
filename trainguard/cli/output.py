"""Shared terminal output for the commands: the attempts table and one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

from trainguard.core import report
from trainguard.core.attempt import AttemptSummary

# Piped output (CI logs, notebooks' subprocess cells) would otherwise be cut to 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=160)
errors = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line of error and exit non-zero."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def attempts_table(summaries: Sequence[AttemptSummary], title: str) -> Table:
    """The run's attempts as a rich table, one row per attempt."""
    table = Table(title=title, show_lines=False, expand=False)
    for column in report.TABLE_COLUMNS:
        table.add_column(column, overflow="fold")
    styles = {"Completed": "green", "Failed": "red", "Crashed": "magenta"}
    for summary in summaries:
        row = report.table_row(summary)
        row["state"] = f"[{styles.get(summary.state, 'white')}]{summary.state}[/]"
        table.add_row(*row.values())
    return table
