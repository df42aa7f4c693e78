"""The backend seam: where a training attempt runs, behind one Protocol that every backend implements.

The attempt flow, the training-run driver and the retry hooks talk to a `Backend` and never name a
backend class: a local process, a Kubernetes Job and a Slurm job look the same from there. A
backend launches an attempt and waits until it is terminal, freezes its own evidence into a store
(best effort, never raising), hands triage its signals and lists the run's checkpoints.

Also here, because every backend must agree on them: the typed values that cross the seam
(`Launch`, `AttemptRef`, `AttemptOutcome`) and `container_env`, the one function that builds the
training container's environment. The optional capabilities a backend may add beside the seam
(`PlacesOnNodes`, `StopsOrphans`, `SeesNodes`, `Supervises`) are in `capabilities`. How each
backend does its work lives in its own adapter module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

from trainguard_entrypoint.notice import NOTICE_GRACE_ENV

from trainguard.core.backends import workspace as workspace_files
from trainguard.core.backends.forensics import StackCapture, capture_env, flight_recorder_env
from trainguard.core.attempt import AttemptSummary
from trainguard.core.evidence.manifest import Manifest, storage_failures
from trainguard.core.spec import TrainingSpec
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.triage.signals import LogSource, Signals

# Reasons every backend uses for how an attempt ended, beside the platform's own words
# (OOMKilled, Evicted, DeadlineExceeded, NODE_FAIL, ...), which backends pass through unchanged.
COMPLETED = "Completed"
ERROR = "Error"
CANCELLED = "Cancelled"
START_ERROR = "StartError"
LOST = "Lost"  # the attempt's supervisor was lost, and nothing it left says how the attempt ended

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class Launch:
    """What to run for one attempt, the same for every backend.

    Attributes:
        run_id: The run every attempt shares.
        attempt: This attempt's number, from 1.
        command: The training command's argv.
        env: The user's variables for the command (the spec's `env`, secrets already resolved);
            `container_env` adds trainguard's own.
        workdir: The command's working directory, where the backend can honour one.
        gpus: GPUs each node of the attempt holds (for placement; GPU-seconds count them on every node).
        nodes: Nodes of the attempt (pods of an Indexed Job, nodes of a Slurm job); the ranks of all of
            them fail together, and the culprit is found among them.
        processes_per_node: Ranks each node runs (torchrun's nproc_per_node).
        deadline_seconds: Wall time after which the attempt is stopped.
        stall_seconds: Silence on the log after which the attempt is stopped.
        resume_from: The checkpoint to resume from, as the backend listed it; None = from scratch.
        avoid_nodes: Nodes to keep off (earlier attempts failed there, or the shared avoid list's).
        memory_factor: Scale for the memory request/limit (>= 1), e.g. after a host OOM.
        notice_grace_seconds: Time the training has from a notice to the hard stop; None: the backend's.
    """

    run_id: str
    attempt: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    gpus: int = 0
    nodes: int = 1
    processes_per_node: int = 1
    deadline_seconds: float | None = None
    stall_seconds: float | None = None
    resume_from: str | None = None
    avoid_nodes: tuple[str, ...] = ()
    memory_factor: float = 1.0
    notice_grace_seconds: float | None = None

    @classmethod
    def of(cls, spec: TrainingSpec, *, run_id: str, attempt: int, resume_from: str | None = None,
           avoid_nodes: Sequence[str] = (), memory_factor: float = 1.0) -> Launch:
        """What runs for this attempt of ``spec``: its command and limits, with the attempt's lineage."""
        return cls(
            run_id=run_id, attempt=attempt, command=tuple(spec.command), env=dict(spec.env), workdir=spec.workdir,
            gpus=spec.gpus, nodes=spec.nodes, processes_per_node=spec.nprocs, deadline_seconds=spec.deadline_seconds,
            stall_seconds=spec.stall_seconds, resume_from=resume_from, avoid_nodes=tuple(avoid_nodes),
            memory_factor=memory_factor, notice_grace_seconds=spec.notice_grace_seconds,
        )


@dataclass(frozen=True)
class AttemptRef:
    """Enough to find an attempt again: to supervise, adopt, collect from and clean it up.

    Attributes:
        backend: The backend kind ("local", "kubernetes", "slurm").
        run_id: The run.
        attempt: The attempt number.
        name: The backend's own name for the attempt (a folder, a Job name, a job name).
        workspace: A folder on the flow's machine that holds the attempt's files, where one exists.
        checkpoint_dir: The run's checkpoint folder as the training command sees it.
        details: Anything else the backend needs to find it (namespace, job id, ...).
    """

    backend: str
    run_id: str
    attempt: int
    name: str
    workspace: str | None = None
    checkpoint_dir: str | None = None
    details: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["details"] = dict(self.details)
        return data


@dataclass(frozen=True)
class AttemptOutcome:
    """How an attempt ended, as the backend saw it: everything triage and the report need.

    Attributes:
        exit_code: The command's exit status, shell style (128+N for signal N); None if it never ran.
        signal: The signal that killed the command, if any.
        reason: `COMPLETED`, `ERROR`, `CANCELLED`, `START_ERROR`, or the platform's own word
            (OOMKilled, Evicted, DeadlineExceeded, Stalled, BackoffLimitExceeded, NODE_FAIL, ...).
        message: One line a person can read.
        started_at, finished_at: ISO-8601 UTC timestamps, where known.
        duration_seconds: Wall time the attempt held its resources.
        node: The node the attempt ran on, where known.
        conditions: Pod/Job conditions in Kubernetes wire form (type, status, reason, message).
        events: Platform events in Kubernetes wire form (reason, message, type, involvedObject).
        log_path: A local file with the attempt's log, where the backend has one.
        log_tail: The last lines of output the backend saw, for when the log file is incomplete.
        storage_problems: Files of the attempt that could not be written (a full disk), one line each.
        instance: The backend's own name for what ran the command and decided the outcome (a pod),
            where it has one; evidence about "the" attempt is read from that one, not a replacement.
        placement: What the backend had to change about where the attempt ran, for the report (one pod
            per node relaxed to preferred), where it changed anything.
    """

    exit_code: int | None
    signal: int | None
    reason: str
    message: str
    started_at: str | None = None
    finished_at: str | None = None
    duration_seconds: float = 0.0
    node: str | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()
    events: tuple[Mapping[str, Any], ...] = ()
    log_path: str | None = None
    log_tail: str = ""
    storage_problems: tuple[str, ...] = ()
    instance: str | None = None
    placement: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.reason == COMPLETED

    def into(self, summary: AttemptSummary, state: str | None = None) -> AttemptSummary:
        """``summary`` with how the attempt ended; its ``state`` "Completed" or "Failed" unless given."""
        return replace(summary, state=state or ("Completed" if self.succeeded else "Failed"),
                       exit_code=self.exit_code, termination_reason=self.reason, node=self.node,
                       duration_seconds=self.duration_seconds, placement=self.placement,
                       storage_problems=(*summary.storage_problems, *self.storage_problems))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["conditions"] = [dict(c) for c in self.conditions]
        data["events"] = [dict(e) for e in self.events]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptOutcome:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["conditions"] = tuple(values.get("conditions") or ())
        values["events"] = tuple(values.get("events") or ())
        values["storage_problems"] = tuple(str(p) for p in values.get("storage_problems") or ())
        values.setdefault("exit_code", None)
        values.setdefault("signal", None)
        values.setdefault("reason", ERROR)
        values.setdefault("message", "")
        return cls(**values)

    @classmethod
    def never_ran(cls, message: str) -> AttemptOutcome:
        """The outcome of an attempt that was never launched (provisioning failed)."""
        return cls(exit_code=None, signal=None, reason=ERROR, message=message)


@dataclass(frozen=True)
class CollectedEvidence:
    """What `Backend.collect_evidence` kept: the manifest and where the bundle lives. What of it still waits
    in the local spool is asked when the verdict is kept (`evidence.verdicts.keep`)."""

    manifest: Manifest
    location: str

    @property
    def storage_problems(self) -> list[str]:
        """What the store failed to take, one line each (not what the attempt never produced)."""
        return storage_failures(self.manifest)

    def into(self, summary: AttemptSummary, unreserved: str | None = None) -> AttemptSummary:
        """``summary`` with this evidence; ``unreserved``: why no space was set aside for the manifest beforehand."""
        return summary.with_evidence(self.location, len(self.manifest.items), len(self.manifest.absent),
                                     problems=self.storage_problems, unreserved=unreserved)


@runtime_checkable
class Backend(Protocol):
    """Where training attempts run. Implementations are adapters over one external system each."""

    @property
    def kind(self) -> str:
        """The backend's kind ("local", "kubernetes", "slurm"), as `AttemptRef.backend` names it."""
        ...

    def provision(self, run_id: str, attempt: int) -> AttemptRef:
        """Prepare the attempt's place (folders, volumes) and say how to find it again."""
        ...

    def run(self, ref: AttemptRef, launch: Launch, on_line: LineSink | None = None) -> AttemptOutcome:
        """Launch the attempt (or adopt one already launched for `ref`) and wait until it is terminal.

        Live output lines go to `on_line`. A stop from outside (SIGTERM, cancellation) stops the
        attempt and is re-raised; nothing the platform cleans up is deleted before evidence is kept.
        """
        ...

    def collect_evidence(
        self, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None,
        extra: Mapping[str, bytes] | None = None,
    ) -> CollectedEvidence:
        """Freeze everything the attempt left into `store` with a manifest. Best effort: never raises."""
        ...

    def signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> Signals:
        """What triage reads: exit code, reason, conditions, events and the log.

        Valid once `collect_evidence` has run for ``ref``, in this process or an earlier one: a
        backend whose platform deletes what the attempt left reads what collection kept (the
        Kubernetes backend, its pod's status, events and log, kept on this machine beside the
        evidence). Before that, or where collection could not keep it, it says what ``outcome``
        alone says. Each call gives a fresh log source, so two readers (triage, the progress
        chart) never share a stream.
        """
        ...

    def log(self, ref: AttemptRef, outcome: AttemptOutcome) -> LogSource:
        """The attempt's log as `signals` gives it, alone: the ranks' error files and stacks are not read
        (the progress chart needs the log only, and the job's files are read once, by triage)."""
        ...

    def checkpoints(self, run_id: str) -> list[str]:
        """The run's checkpoints, newest first, as the training command names them."""
        ...

    def lost_outcome(self, ref: AttemptRef) -> AttemptOutcome:
        """How an attempt ended whose supervisor was lost (its flow process died), from what the platform
        or the attempt itself kept; reason `LOST` when nothing says. Never raises."""
        ...

    def release(self, ref: AttemptRef) -> str | None:
        """Let the platform clean the attempt up (delete it, or start its TTL). Called after evidence is kept.

        Returns once nothing of the attempt still runs (a stopping pod may still be saving a checkpoint);
        a line to warn with when that could not be seen to its end, else None."""
        ...


@dataclass(frozen=True)
class Rendezvous:
    """Where an attempt's ranks meet: the first node's address and port, and this node's rank."""

    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    node_rank: int = 0


def rendezvous_env(launch: Launch, rendezvous: Rendezvous) -> dict[str, str]:
    """The variables that let one command run on 1 node or 64: torchrun's own (`PET_*`, which its
    command-line options override) and the plain ones other launchers read.

    torchrun is told never to restart ranks itself (`PET_MAX_RESTARTS=0`): trainguard alone retries.
    A backend whose nodes learn their rank at run time (a pod's completion index, Slurm's node id)
    overrides `NODE_RANK` and `PET_NODE_RANK` there.
    """
    nodes, nprocs = str(launch.nodes), str(launch.processes_per_node)
    port, rank = str(rendezvous.master_port), str(rendezvous.node_rank)
    return {
        "PET_NNODES": nodes, "PET_NODE_RANK": rank, "PET_NPROC_PER_NODE": nprocs,
        "PET_MASTER_ADDR": rendezvous.master_addr, "PET_MASTER_PORT": port, "PET_MAX_RESTARTS": "0",
        "MASTER_ADDR": rendezvous.master_addr, "MASTER_PORT": port, "NNODES": nodes, "NODE_RANK": rank,
        "WORLD_SIZE": str(launch.nodes * launch.processes_per_node),
    }


def container_env(
    launch: Launch, *, workspace: str, checkpoint_dir: str | None, base: Mapping[str, str] | None = None,
    rendezvous: Rendezvous | None = None, capture: StackCapture = StackCapture(),
) -> dict[str, str]:
    """The training container's environment, for every backend: the user's variables plus trainguard's.

    Beside trainguard's own (`TRAINGUARD_*`), the rendezvous (`rendezvous_env`), and where every
    node's torchrun keeps its ranks' logs and its root-cause error: `PET_LOG_DIR` with `PET_TEE=3`
    (each rank's stdout and stderr in a file of its own on the attempt's folder, and still on the
    console, each line prefixed with its rank) and `TORCHELASTIC_ERROR_FILE`; and how the entrypoint
    takes the ranks' stacks before a hang is ended (`forensics`). The user's variables win over the
    logging and flight-recorder ones (`PET_TEE=0`: no prefixes), never over the rendezvous or trainguard's.

    Args:
        launch: The attempt being launched (its `env` holds the user's variables).
        workspace: The attempt's folder as the container sees it.
        checkpoint_dir: The run's checkpoint folder as the container sees it.
        base: Variables underneath everything (the local backend passes its own environment).
        rendezvous: Where the ranks meet; the first node on loopback when None.
        capture: The backend's stack-capture settings (its block's).

    Raises:
        ValueError: A variable name or value cannot be passed to a process (one line naming it).
    """
    env = {**dict(base or {}), **workspace_files.torchrun_env(workspace), **flight_recorder_env(workspace)}
    for name, value in launch.env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ValueError(f"env[{name!r}]: not a valid variable name; use letters, digits and '_'")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"env[{name!r}]: the value must be a string without NUL characters")
        env[name] = value
    env.update(TRAINGUARD_RUN_ID=launch.run_id, TRAINGUARD_ATTEMPT=str(launch.attempt), TRAINGUARD_WORKSPACE=workspace,
               TRAINGUARD_RESUME_FROM=launch.resume_from or "", **capture_env(launch.stall_seconds, capture))
    env.update(rendezvous_env(launch, rendezvous or Rendezvous()))
    if checkpoint_dir:
        env["TRAINGUARD_CHECKPOINT_DIR"] = checkpoint_dir
    if launch.workdir:
        env["TRAINGUARD_WORKDIR"] = launch.workdir
    if launch.notice_grace_seconds:  # a backend whose stop gives another grace sets its own
        env[NOTICE_GRACE_ENV] = f"{launch.notice_grace_seconds:g}"
    return env
