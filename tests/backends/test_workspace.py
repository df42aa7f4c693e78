"""The attempt workspace layout: one folder per attempt, one checkpoint folder per run."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core.backends.workspace import AttemptWorkspace, WorkspaceError
from trainguard.core.ids import InvalidId


def test_create_lays_out_the_attempt_folders_and_the_shared_checkpoint_folder(tmp_path: Path) -> None:
    ws = AttemptWorkspace.create(tmp_path, "llama-ft.2024_06", 2)

    run_dir = tmp_path / "runs" / "llama-ft.2024_06"
    assert ws.root == run_dir / "attempt-2"
    assert ws.checkpoint_dir == run_dir / "checkpoints"
    assert ws.log_path == ws.root / "logs" / "train-llama-ft.2024_06-attempt-2.log"
    assert all((ws.root / name).is_dir() for name in ("logs", "coredumps", "snapshot"))
    assert ws.checkpoint_dir.is_dir()


def test_attempts_of_one_run_share_the_checkpoint_folder(tmp_path: Path) -> None:
    first, second = AttemptWorkspace.create(tmp_path, "r1", 1), AttemptWorkspace.create(tmp_path, "r1", 2)

    assert first.checkpoint_dir == second.checkpoint_dir
    assert first.root != second.root


def test_create_is_idempotent(tmp_path: Path) -> None:
    assert AttemptWorkspace.create(tmp_path, "r1", 1) == AttemptWorkspace.create(tmp_path, "r1", 1)


@pytest.mark.parametrize("run_id", ["", "../escape", "a/b", "..", ".hidden", "x" * 200, "spaces here", "r1\n"])
def test_an_unsafe_run_id_is_refused_with_one_line_naming_it(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(InvalidId, match="run_id") as caught:
        AttemptWorkspace.create(tmp_path, run_id, 1)

    assert "\n" not in str(caught.value).replace(repr(run_id), "")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("attempt", [0, -1, True, "1"])
def test_an_attempt_below_one_or_not_an_int_is_refused(tmp_path: Path, attempt: object) -> None:
    with pytest.raises(InvalidId, match=r"attempt .* attempts are numbered 1, 2, 3"):
        AttemptWorkspace.create(tmp_path, "r1", attempt)  # type: ignore[arg-type]


def test_an_unwritable_work_root_is_a_workspace_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")

    with pytest.raises(WorkspaceError, match="work_root .* point work_root at a writable directory"):
        AttemptWorkspace.create(blocker, "r1", 1)
