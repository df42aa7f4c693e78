"""An attempt's checkpoint facts (kinds, steps, steps lost, notice to acknowledgement) from hand-made
checkpoint folders and acknowledgements, written as the helper's contract spells them; and the reports
that show them."""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.checkpoints import facts
from trainguard.core.reports.attempt import render_attempt
from trainguard.core.reports.run import render_run

NOTICE = {"version": 1, "reason": "preemption", "given_at": 1000.0, "deadline": 1030.0, "source": "test"}


def _checkpoint(folder: Path, name: str, step: int, kind: str | None, **more: object) -> None:
    """A checkpoint file, and its acknowledgement unless ``kind`` is None (the training's own save)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"weights")
    if kind is None:
        return
    ack = {"version": 1, "checkpoint": name, "step": step, "kind": kind,
           "files": [{"name": name, "size_bytes": 7,
                      "sha256": "0" * 64}], "saved_by_rank": 0, "world_size": 2, "written_at": 1003.0,
           "notice": None, "seconds_from_notice": None, "failure": None, "seconds_from_failure": None, **more}
    (folder / ".trainguard-acks").mkdir(exist_ok=True)
    (folder / ".trainguard-acks" / f"{name}.json").write_text(json.dumps(ack))


def _progress(folder: Path, step: int, attempt: str) -> None:
    (folder / ".trainguard-acks").mkdir(parents=True, exist_ok=True)
    (folder / ".trainguard-acks" / "progress.json").write_text(
        json.dumps({"version": 1, "step": step, "at": 1001.0, "attempt": attempt}))


def test_kinds_and_steps_come_from_the_acknowledgements_and_steps_lost_from_the_helpers_progress(tmp_path) -> None:
    backend = LocalBackend(work_root=tmp_path / "work")
    folder = backend.checkpoint_folder("r1")
    _checkpoint(folder, "ckpt-40.pt", 40, "periodic")
    _checkpoint(folder, "ckpt-87.pt", 87, "notice", notice=NOTICE, seconds_from_notice=3.25)
    _progress(folder, 92, "2")

    found = facts(backend, "r1", 2, str(folder / "ckpt-40.pt"), str(folder / "ckpt-87.pt"), [(90, 0.5)])

    assert (found.resumed_from_kind, found.resumed_from_step) == ("periodic", 40)
    assert (found.newest_kind, found.newest_step, found.progress_step) == ("notice", 87, 92)
    assert (found.steps_lost, found.notice_to_ack_seconds) == (5, 3.25)


def test_without_acknowledgements_a_checkpoint_is_periodic_with_its_names_step_and_the_log_says_the_progress(
        tmp_path) -> None:
    backend = LocalBackend(work_root=tmp_path / "work")
    folder = backend.checkpoint_folder("r1")
    _checkpoint(folder, "step-000120.pt", 120, None)
    _progress(folder, 300, "1")  # an earlier attempt's progress says nothing of attempt 2

    found = facts(backend, "r1", 2, None, str(folder / "step-000120.pt"), [(100, 1.0), (131, 0.9)])

    assert (found.resumed_from_kind, found.newest_kind, found.newest_step) == (None, "periodic", 120)
    assert (found.progress_step, found.steps_lost, found.notice_to_ack_seconds) == (131, 11, None)


def test_a_just_in_time_save_and_no_checkpoint_at_all_and_a_hostile_ack(tmp_path) -> None:
    backend = LocalBackend(work_root=tmp_path / "work")
    folder = backend.checkpoint_folder("r1")
    _progress(folder, 50, "1")
    assert facts(backend, "r1", 1, None, None).steps_lost == 50  # nothing kept: all of it is redone

    _checkpoint(folder, "jit-49", 49, "just_in_time", failure="rank 3 died", seconds_from_failure=1.5)
    assert (facts(backend, "r1", 1, None, str(folder / "jit-49")).newest_kind,
            facts(backend, "r1", 1, None, str(folder / "jit-49")).steps_lost) == ("just_in_time", 1)

    (folder / ".trainguard-acks" / "jit-49.json").write_bytes(b"\xff{not json" * 1000)
    assert facts(backend, "r1", 1, None, str(folder / "jit-49")).newest_kind == "periodic"  # its own save, then
    (folder / ".trainguard-acks" / "jit-49.json").unlink()
    (folder / ".trainguard-acks" / "jit-49.json").symlink_to("/etc/passwd")
    assert facts(backend, "r1", 1, None, str(folder / "jit-49")).newest_kind == "periodic"


def test_a_backend_that_cannot_read_its_checkpoints_here_and_made_no_listing_says_unknown(tmp_path) -> None:
    kube = KubernetesBackend(connect=lambda: None, settings=KubeSettings(job=JobSettings(image="trainguard:test")))  # type: ignore[arg-type,return-value]
    found = facts(kube, "r1", 2, "/checkpoints/ckpt-40.pt", "/checkpoints/ckpt-87.pt", [(92, None)])
    assert (found.resumed_from_kind, found.newest_kind, found.newest_step) == ("unknown", "unknown", 87)
    assert (found.progress_step, found.steps_lost) == (92, 5)


def _attempt(n: int, state: str, duration: float, **facts_: object) -> AttemptSummary:
    return AttemptSummary("r1", n, 3, state, category=None if state == "Completed" else "preempted",
                          duration_seconds=duration, gpus=1, **facts_)  # type: ignore[arg-type]


def test_the_reports_show_the_facts_and_the_run_report_where_the_time_went() -> None:
    first = _attempt(1, "Failed", 100.0, newest_checkpoint="/c/ckpt-80.pt", newest_checkpoint_kind="notice",
                     newest_checkpoint_step=80, progress_step=100, steps_lost=20, notice_to_ack_seconds=2.5)
    second = _attempt(2, "Failed", 30.0, resumed_from="/c/ckpt-80.pt", resumed_from_kind="notice",
                      resumed_from_step=80, progress_step=80, steps_lost=0, newest_checkpoint="/c/ckpt-80.pt")
    third = _attempt(3, "Completed", 60.0, resumed_from="/c/ckpt-80.pt", resumed_from_step=80, progress_step=200)

    report = render_attempt(first)
    assert "| newest checkpoint left | a notice, step 80 checkpoint |" in report
    assert "| steps lost | 20 (its last step 100; the next attempt resumes from step 80) |" in report
    assert "| notice to checkpoint | 2.5 s" in report
    assert "| resumed from | a notice, step 80 checkpoint |" in render_attempt(second)

    run = render_run([first, second, third])
    assert "140.0 s of 190.0 s of the attempts' wall time (74%) made the 200 steps that count; 20 steps were lost." in run
    assert "| steps lost (attempt 1, preempted: 20 steps redone) | 20.0 |" in run
    assert "| not training (attempt 2, preempted: no step made) | 30.0 |" in run
    # the headline's waste is the same account: the 20 steps attempt 1 lost, and attempt 2 in full
    assert "3 attempt(s), 190 GPU-seconds, 50 of them wasted." in run
    assert "| 100.0 s | 100 (20) |" in run and "| 30.0 s | 30 (30) |" in run
    assert "Effective training time" not in render_run([_attempt(1, "Failed", 5.0)])  # no step recorded: not said
