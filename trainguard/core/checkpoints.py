"""What an attempt's checkpoints say: which it resumed from and of what kind, the newest it left, the steps it lost.

A checkpoint's kind and step come from its acknowledgement, where the training-side helper wrote
one (`trainguard_entrypoint.acks`: "periodic", "notice" or "just_in_time", with the optimizer
step and the seconds from the notice to the save). A checkpoint without one is the training's own
save: ``periodic``, its step read from its name where the name carries one. Where this machine cannot
read the run's checkpoint folder (a Kubernetes volume), the backend's listing read them there
(`ListsCheckpoints`); without one, every kind is ``unknown``. Steps lost are the
last optimizer step the attempt completed (the helper's ``progress.json``, else the newest step its
log shows) minus the step the next attempt resumes from: the newest checkpoint's, 0 without one.
Read once per attempt, when it is judged (`read`: the listing the retry decision weighs and the facts
the verdict records, one value for the attempt flow and the recovery path alike); everything the job
wrote is read as hostile, never raising.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePath

from trainguard_entrypoint import acks
from trainguard_entrypoint.resumable import step_number

from trainguard.core import progress
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend
from trainguard.core.backends.capabilities import CheckpointListing, ListsCheckpoints, ReadsCheckpoints

PERIODIC, UNKNOWN = "periodic", "unknown"


@dataclass(frozen=True)
class CheckpointFacts:
    """One attempt's checkpoints as its verdict records them (None: not known, or not applicable).

    Attributes:
        resumed_from_kind, resumed_from_step: The checkpoint it resumed from: its kind and step (None: from scratch).
        newest_kind, newest_step: The newest checkpoint of the run after it: its kind and optimizer step.
        progress_step: The last optimizer step it completed.
        steps_lost: ``progress_step`` minus the step the next attempt resumes from.
        notice_to_ack_seconds: From the notice to the newest checkpoint's acknowledgement, when notice was given.
    """

    resumed_from_kind: str | None = None
    resumed_from_step: int | None = None
    newest_kind: str | None = None
    newest_step: int | None = None
    progress_step: int | None = None
    steps_lost: int | None = None
    notice_to_ack_seconds: float | None = None

    def into(self, summary: AttemptSummary) -> AttemptSummary:
        """``summary`` with these facts."""
        return replace(summary, resumed_from_kind=self.resumed_from_kind, resumed_from_step=self.resumed_from_step,
                       newest_checkpoint_kind=self.newest_kind, newest_checkpoint_step=self.newest_step,
                       progress_step=self.progress_step, steps_lost=self.steps_lost,
                       notice_to_ack_seconds=self.notice_to_ack_seconds)


@dataclass(frozen=True)
class CheckpointReading:
    """The run's checkpoints just after one attempt, read once.

    Attributes:
        listing: The run's checkpoints, newest first, as the backend names them: what the retry decision weighs.
        points: The (step, loss) points the attempt's log shows.
        facts: What its verdict records of them.
    """

    listing: tuple[str, ...]
    points: tuple[tuple[int, float | None], ...]
    facts: CheckpointFacts

    @property
    def newest(self) -> str | None:
        """The checkpoint the next attempt resumes from (None: from scratch)."""
        return self.listing[0] if self.listing else None

    def into(self, summary: AttemptSummary) -> AttemptSummary:
        """``summary`` with its progress, the run's newest checkpoint and the checkpoint facts."""
        return self.facts.into(summary.with_progress(self.points, self.newest))


def logged_points(backend: Backend, ref: AttemptRef, outcome: AttemptOutcome) -> list[progress.Point]:
    """The (step, loss) points the attempt's log shows, as the backend gives the log: the run report's chart,
    and the attempt's progress where the helper kept none; [] when the backend cannot say (never stops a verdict)."""
    try:
        log = backend.log(ref, outcome)
    except Exception:
        return []
    if isinstance(log, bytes):
        log = log.decode("utf-8", errors="replace")
    return progress.read_points(log if isinstance(log, str | Path) else None)


def read(backend: Backend, run_id: str, attempt: int, resumed_from: str | None,
         logged: Sequence[tuple[int, float | None]]) -> CheckpointReading:
    """List the run's checkpoints after ``attempt`` and read their facts (see `facts`); listing may take a pod
    of its own (Kubernetes), so a caller says so while it lasts."""
    listing = tuple(backend.checkpoints(run_id))
    newest = listing[0] if listing else None
    return CheckpointReading(listing, tuple(logged), facts(backend, run_id, attempt, resumed_from, newest, logged))


def _read_here(folder: Path, checkpoints: Sequence[str | None]) -> CheckpointListing:
    """What a listing would say of ``checkpoints`` (and the helper's progress), read in ``folder`` on this machine.

    The one place trainguard's core reads an acknowledgement; only the entries asked about are read.
    """
    entries = sorted({_entry(checkpoint) for checkpoint in checkpoints if checkpoint})
    read = {name: ack for name in entries if (ack := acks.read_ack(folder, name)) is not None}
    return CheckpointListing(checkpoints=tuple(name for name in entries if (folder / name).exists()),
                             acks={name: acks.AckBrief.of(ack) for name, ack in read.items()},
                             progress=acks.read_progress(folder))


def facts(backend: Backend, run_id: str, attempt: int, resumed_from: str | None, newest: str | None,
          logged: Sequence[tuple[int, float | None]] = ()) -> CheckpointFacts:
    """The checkpoint facts of one attempt, just after it ended (see the module docstring).

    Args:
        backend: Where it ran; a backend that `ReadsCheckpoints` here, or `ListsCheckpoints` (what its last
            listing read), says kinds and acknowledgements.
        run_id, attempt: The attempt.
        resumed_from: The checkpoint it resumed from, as the backend listed it.
        newest: The run's newest checkpoint after it, as the backend lists them (what the next attempt resumes from).
        logged: The (step, loss) points its log shows, for its progress where the helper kept none.
    """
    if isinstance(backend, ReadsCheckpoints):
        seen: CheckpointListing | None = _read_here(backend.checkpoint_folder(run_id), (newest, resumed_from))
    else:
        seen = backend.checkpoint_listing(run_id) if isinstance(backend, ListsCheckpoints) else None
    newest_ack, resumed_ack = _ack(seen, newest), _ack(seen, resumed_from)
    progress = _progress(seen, attempt)
    progress = progress if progress is not None else max((step for step, _ in logged), default=None)
    newest_step = newest_ack.step if newest_ack is not None else (checkpoint_step(newest) if newest else 0)
    return CheckpointFacts(
        resumed_from_kind=_kind(seen, resumed_from, resumed_ack),
        resumed_from_step=resumed_ack.step if resumed_ack is not None else checkpoint_step(resumed_from),
        newest_kind=_kind(seen, newest, newest_ack),
        newest_step=newest_step if newest else None, progress_step=progress,
        steps_lost=max(0, progress - newest_step) if progress is not None and newest_step is not None else None,
        notice_to_ack_seconds=newest_ack.seconds_from_notice if newest_ack is not None else None,
    )


def checkpoint_step(checkpoint: str | None) -> int | None:
    """The step a checkpoint's name carries (`step-000020.json`, `ckpt_1200.pt`), if any: read by the
    rule that ranks the checkpoints to resume from (`trainguard_entrypoint.resumable.step_number`)."""
    return step_number(PurePath(checkpoint).name) if checkpoint else None


def _entry(checkpoint: str) -> str:
    return PurePath(checkpoint).name


def _ack(seen: CheckpointListing | None, checkpoint: str | None) -> acks.AckBrief | None:
    return seen.acks.get(_entry(checkpoint)) if seen is not None and checkpoint else None


def _progress(seen: CheckpointListing | None, attempt: int) -> int | None:
    """The helper's last completed step, when this attempt wrote it (an earlier attempt's says nothing of this one)."""
    progress = seen.progress if seen is not None else None
    return progress.step if progress is not None and progress.attempt == str(attempt) else None


def _kind(seen: CheckpointListing | None, checkpoint: str | None, ack: acks.AckBrief | None) -> str | None:
    """The checkpoint's kind: its acknowledgement's, else periodic when it is there (the training's own save)."""
    if not checkpoint:
        return None
    if seen is None:
        return UNKNOWN
    if ack is not None:
        return ack.kind
    return PERIODIC if _entry(checkpoint) in seen.checkpoints else UNKNOWN
