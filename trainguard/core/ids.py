"""Run and attempt ids, and the one layout every place shares: ``runs/{run id}/attempt-{n}``.

The same relative path names an attempt's evidence in a store and its folder under a backend's
work root, and ``runs/{run id}/checkpoints`` the folder every attempt of a run shares. This module
alone spells that layout and reads it back from keys and folder names; what lies inside an
attempt's folder is ``backends.workspace``'s.
"""

from __future__ import annotations

import re

RUNS = "runs"
CHECKPOINTS = "checkpoints"
# A run id becomes a directory name and part of a log file name, so it must be one safe segment.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ATTEMPT_NAME = re.compile(r"attempt-(\d+)")
_ATTEMPT_PATH = re.compile(r"^runs/([^/]+)/attempt-(\d+)(?:/|$)")


class InvalidId(ValueError):
    """A run id or attempt number that cannot name a folder or a key; the message says what to fix."""


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` unchanged, or raise a one-line `InvalidId` saying what to fix.

    Args:
        run_id: The identifier shared by every attempt of one training run.
    """
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise InvalidId(
            f"run_id {run_id!r} is not a safe path segment: use 1-128 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (e.g. 'llama-ft-2024-06-01')"
        )
    return run_id


def validate_attempt(attempt: int) -> int:
    """Return ``attempt`` unchanged, or raise a one-line `InvalidId` saying what to fix."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidId(f"attempt {attempt!r} is invalid: attempts are numbered 1, 2, 3, ...")
    return attempt


def run_path(run_id: str) -> str:
    """``runs/{run_id}``: where everything of one run lies."""
    return f"{RUNS}/{validate_run_id(run_id)}"


def attempt_name(attempt: int) -> str:
    """``attempt-{n}``: an attempt's folder (or key segment) among its run's."""
    return f"attempt-{validate_attempt(attempt)}"


def attempt_path(run_id: str, attempt: int) -> str:
    """``runs/{run_id}/attempt-{n}``: one attempt's folder under a work root, or its prefix in a store."""
    return f"{run_path(run_id)}/{attempt_name(attempt)}"


def checkpoints_path(run_id: str) -> str:
    """``runs/{run_id}/checkpoints``: the folder every attempt of a run shares, under a work root."""
    return f"{run_path(run_id)}/{CHECKPOINTS}"


def attempt_number(name: str) -> int | None:
    """The number an attempt's folder name carries (``attempt-3`` → 3); None for any other name."""
    match = _ATTEMPT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_attempt_path(path: str) -> tuple[str, int] | None:
    """(run id, attempt) of a key or relative path at or under ``runs/{run}/attempt-{n}``; else None."""
    match = _ATTEMPT_PATH.match(path)
    return (match.group(1), int(match.group(2))) if match else None
