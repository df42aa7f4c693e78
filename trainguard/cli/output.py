"""Shared terminal output for the commands: the attempts table, plain lines and one-line errors.

Every piece of text that is not our own wording (log lines, run names, paths, messages that quote
them) reaches rich as `Text`, never as markup: ``[/]`` or ``[x](...)`` in a crash line prints as
it is. It is also masked and stripped of terminal control sequences on the way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainguard.core import masking
from trainguard.core.reports import attempt as attempt_report
from trainguard.core.attempt import AttemptSummary

# Piped output (CI logs, notebooks' subprocess cells) would otherwise be cut to 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=160)
errors = Console(stderr=True)

STATE_STYLES = {"Completed": "green", "Failed": "red", "Crashed": "magenta", "Cancelled": "yellow"}


def plain(text: object, style: str = "") -> Text:
    """Untrusted text as rich `Text`: masked, without control sequences, never read as markup."""
    return Text(masking.for_people(str(text)), style=style)


def escaped(text: str) -> str:
    """``text`` with the backslash and every character that is not printable spelled as a Python escape
    (``\\x1b``, ``\\u202e``): a name shown as it is, without a terminal acting on it."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(char if char.isprintable() and char != "\\" else char.encode("unicode_escape", "backslashreplace")
                   .decode("ascii") for char in text)


def say(*parts: object, style: str = "") -> None:
    """Print one line of untrusted text (``Text`` parts keep their styles)."""
    line = Text()
    for part in parts:
        line.append_text(part if isinstance(part, Text) else plain(part))
    console.print(line, style=style, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line of error and exit non-zero.

    The message is trainguard's own wording: the secret values it may quote are masked, but not the
    token shapes, which would mask its own help (``secret_env: {NAME: 'env:VARIABLE'}``).
    """
    line = masking.for_own_words(" ".join(message.splitlines()))
    errors.print(Text.assemble(("error:", "bold red"), " ", Text(line)), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def attempts_table(summaries: Sequence[AttemptSummary], title: str) -> Table:
    """The run's attempts as a rich table, one row per attempt."""
    table = Table(title=plain(title), show_lines=False, expand=False)
    for column in attempt_report.TABLE_COLUMNS:
        table.add_column(column, overflow="fold")
    for summary in summaries:
        row = {name: plain(value) for name, value in attempt_report.table_row(summary).items()}
        row["state"] = plain(summary.state, STATE_STYLES.get(summary.state, "white"))
        table.add_row(*row.values())
    return table
