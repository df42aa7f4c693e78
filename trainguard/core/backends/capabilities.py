"""The optional capabilities beside the backend seam: protocols a caller tests with `isinstance`.

A backend implements `trainguard.core.backends.base.Backend` and, where its platform allows, any of
these: naming the nodes an attempt could be placed on (`PlacesOnNodes`), stopping what a dead flow
process left running (`StopsOrphans`), handing triage each node's signals (`SeesNodes`, with
`NodeEvidence`), keeping a place per attempt where its supervisor is recorded (`Supervises`) and
reading the run's checkpoints on this machine (`ReadsCheckpoints`) or, where only its pods can, handing
on what its listing read there (`ListsCheckpoints`, with `CheckpointListing`). Callers never test for
a backend class, only for one of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from trainguard_entrypoint.acks import AckBrief, Progress

from trainguard.core.backends.base import AttemptOutcome, AttemptRef
from trainguard.core.triage.signals import Signals


@runtime_checkable
class PlacesOnNodes(Protocol):
    """A backend that can name the nodes an attempt could be placed on (the avoid list needs enough left)."""

    def placeable_nodes(self) -> list[str]:
        """The nodes an attempt could be placed on now; raises when it cannot tell."""


@runtime_checkable
class StopsOrphans(Protocol):
    """A backend that can stop an attempt whose supervising flow process died without a word.

    Optional beside `Backend`: the retry controller and the crash hook call it, so no training keeps
    running unsupervised next to the next attempt, on the same checkpoints. `evidence_first` says
    when: False stops first and then collects what the stop left (a local process or a Slurm job
    writes its crash report as it ends); True collects first, because stopping removes what
    evidence is read from (deleting a Job deletes its pods and their logs).
    """

    @property
    def evidence_first(self) -> bool:
        """Whether evidence must be collected before the stop (True) or after it (False)."""
        ...

    def stop_orphan(self, ref: AttemptRef) -> str | None:
        """Stop whatever still runs for `ref`; say what was stopped, or None when nothing ran."""
        ...


@dataclass(frozen=True)
class NodeEvidence:
    """What triage reads of one node of a multi-node attempt, and who the node is.

    Attributes:
        index: The node's index (its pod's completion index, its Slurm node id): the node rank.
        signals: The node's own signals (its pod's exit code, reason, conditions, events, log, error files).
        node: The machine it ran on, where known.
        instance: The backend's name for it (a pod), where it has one.
        ranks: The global ranks its processes held.
        first_error_at: When it first failed, in seconds since the epoch, when the platform says
            (a container's finish time).
    """

    index: int
    signals: Signals
    node: str | None = None
    instance: str | None = None
    ranks: range | None = None
    first_error_at: float | None = None


@runtime_checkable
class SeesNodes(Protocol):
    """A backend that runs one attempt on several nodes and can hand triage each node's signals.

    Optional beside `Backend`: with two or more nodes, triage finds the culprit across them (the
    node whose ranks failed on their own, not the ones that only lost a peer); `signals` still
    gives the attempt's signals as one. Valid when `signals` is.
    """

    def node_signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> list[NodeEvidence]:
        """One entry per node of the attempt, by index; one or none for a single-node attempt."""
        ...


@runtime_checkable
class Supervises(Protocol):
    """A backend that keeps a place per attempt where its supervisor is recorded (a folder it can read).

    Optional beside `Backend`: `trainguard runs` and `trainguard run --resume` ask it which attempts
    a run has beyond those in the evidence store (one lost before its evidence was kept), and
    whether a process on this host still supervises one, so a run that is alive is never resumed
    beside itself. The local and Slurm backends implement it (their attempt folders are on this
    machine, or on a shared filesystem it mounts); the Kubernetes backend does not: its supervisor
    may be a flow pod anywhere, and a run's attempts are known from the store and the cluster.
    """

    def runs(self) -> dict[str, float]:
        """Every run with an attempt folder here, with the time (epoch seconds) it last changed."""
        ...

    def attempts(self, run_id: str) -> list[int]:
        """The run's attempts that have a folder here, in order."""
        ...

    def supervisor_pid(self, run_id: str, attempt: int) -> int | None:
        """The pid of the process still supervising the attempt on this host, if any."""
        ...

    def attempt_folder(self, run_id: str, attempt: int) -> Path:
        """The attempt's folder on this machine (it may not exist): what it left when nothing could be stored."""
        ...


@runtime_checkable
class ReadsCheckpoints(Protocol):
    """A backend whose run checkpoint folder this machine reads (a local folder, a shared filesystem).

    Optional beside `Backend`: the verdict then records each checkpoint's kind and step from its
    acknowledgement, and the steps an attempt lost (`trainguard.core.checkpoints`). The local and
    Slurm backends implement it; the Kubernetes backend does not (its checkpoints live on a volume
    only its pods mount): it `ListsCheckpoints` instead.
    """

    def checkpoint_folder(self, run_id: str) -> Path:
        """The run's checkpoint folder on this machine (it may not exist yet)."""
        ...


@dataclass(frozen=True)
class CheckpointListing:
    """What a listing of a run's checkpoints read where they lie (a pod, on Kubernetes).

    Attributes:
        checkpoints: The entry names a run can resume from, newest first, after the newest whose
            files did not match their acknowledgement were left out.
        acks: The acknowledgements read, by entry name, without their file lists (the files were
            checked where they lie).
        progress: The helper's ``progress.json``, if there was a well-formed one.
        left_out: (entry name, why) of each checkpoint passed over: its files do not match its acknowledgement.
        unchecked: (entry name, why) of a checkpoint kept whose digests were not all compared in time.
        notes: What else the listing could not do, one line each (a folder it may not read, a bound).
    """

    checkpoints: tuple[str, ...] = ()
    acks: Mapping[str, AckBrief] = field(default_factory=dict)
    progress: Progress | None = None
    left_out: tuple[tuple[str, str], ...] = ()
    unchecked: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


@runtime_checkable
class ListsCheckpoints(Protocol):
    """A backend that lists the run's checkpoints where this machine cannot read them, reading their
    acknowledgements and the helper's progress there too (Kubernetes: a pod on the checkpoint volume).

    Optional beside `Backend`: `Backend.checkpoints` makes the listing; this hands on what that
    listing read, so the verdict records kinds, steps and steps lost (`trainguard.core.checkpoints`)
    without a second pod. Callers list first, then ask.
    """

    def checkpoint_listing(self, run_id: str) -> CheckpointListing | None:
        """What the last `checkpoints(run_id)` of this instance read; None when it made none or it failed."""
        ...
