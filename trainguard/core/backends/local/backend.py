"""The local backend: a training attempt as a child process on the flow's own machine.

It adapts `local.LocalProcessRunner` (the process, its limits, its stop) and
`workspace_evidence.collect_local_evidence` (the workspace's files) to the `backend.Backend` seam. The
attempt's folder is on this machine, so the flow reads its files directly.
"""

from __future__ import annotations

import io
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from trainguard_entrypoint import safefiles

from trainguard.core.backends import jobfiles, processes, workspace_evidence
from trainguard.core.backends.forensics import StackCapture
from trainguard.core.backends.jobfiles import Budget
from trainguard.core.backends.local import orphans
from trainguard.core.backends.base import (
    START_ERROR, AttemptOutcome, AttemptRef, CollectedEvidence, Launch, LineSink, Rendezvous, container_env,
)
from trainguard.core.backends.local.runner import TAIL_LINES, LocalProcessRunner, ProcessOutcome
from trainguard.core.evidence.manifest import attempt_prefix
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.triage.signals import LogSource, Signals
from trainguard.core.backends import rankstacks, torchrun, workspace
from trainguard.core.backends.workspace import PROCESS_RECORD, AttemptWorkspace, run_checkpoint_dir

KIND = "local"


@dataclass(frozen=True)
class LocalBackend:
    """Runs attempts as local processes under the container entrypoint, in `work_root`."""

    work_root: Path
    grace_seconds: float = 10.0
    python: str = sys.executable
    budget: Budget = Budget()
    capture: StackCapture = StackCapture()  # the ranks' stacks before a stop: its sweep comes before the grace
    checkpoint_verify_seconds: float = workspace_evidence.VERIFY_SECONDS  # hashing the newest before a resume
    kind: str = KIND
    evidence_first: ClassVar[bool] = False  # a stopped process writes its crash report: collect after the stop

    def workspace(self, ref: AttemptRef) -> AttemptWorkspace:
        """The attempt's folders, recreated if need be."""
        return AttemptWorkspace.create(self.work_root, ref.run_id, ref.attempt)

    def provision(self, run_id: str, attempt: int) -> AttemptRef:
        ws = AttemptWorkspace.create(self.work_root, run_id, attempt)
        return AttemptRef(KIND, run_id, attempt, name=str(ws.root), workspace=str(ws.root),
                          checkpoint_dir=str(ws.checkpoint_dir))

    def run(self, ref: AttemptRef, launch: Launch, on_line: LineSink | None = None) -> AttemptOutcome:
        if launch.nodes > 1:
            return AttemptOutcome(None, None, START_ERROR, f"nodes: {launch.nodes}: the local backend runs one node; "
                                  "run multi-node attempts on a Kubernetes or Slurm backend, or set nodes: 1")
        ws = self.workspace(ref)
        user_env = container_env(launch, workspace=str(ws.root), checkpoint_dir=str(ws.checkpoint_dir),
                                 rendezvous=Rendezvous(master_port=free_port()), capture=self.capture)
        if launch.workdir:
            user_env["TRAINGUARD_WORKDIR"] = os.path.abspath(launch.workdir)
        grace = launch.notice_grace_seconds or self.grace_seconds  # the spec's notice grace, where it sets one
        runner = LocalProcessRunner(python=self.python, grace_seconds=grace, on_line=on_line,
                                    sweep_seconds=self.capture.sweep_seconds)
        result = runner.run(list(launch.command), workspace=ws, env=user_env,
                            deadline_seconds=launch.deadline_seconds, stall_seconds=launch.stall_seconds)
        return outcome_of_process(result)

    def collect_evidence(
        self, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None,
        extra: Mapping[str, bytes] | None = None,
    ) -> CollectedEvidence:
        ws = self.workspace(ref)
        failures = outcome.storage_problems if outcome is not None else ()
        manifest = workspace_evidence.collect_local_evidence(ws, store, extra=extra, write_failures=failures,
                                                             budget=self.budget)
        return CollectedEvidence(manifest, store.describe(attempt_prefix(ref.run_id, ref.attempt)))

    def signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> Signals:
        return Signals(exit_code=outcome.exit_code, reason=outcome.reason, conditions=outcome.conditions,
                       events=outcome.events, log=self.log(ref, outcome),
                       error_files=torchrun.error_files(self.workspace(ref).root),
                       stacks=rankstacks.read_stacks(self.workspace(ref).root, outcome.node))

    def log(self, ref: AttemptRef, outcome: AttemptOutcome) -> LogSource:
        ws = self.workspace(ref)
        log = jobfiles.readable_log(Path(outcome.log_path) if outcome.log_path else ws.log_path, ws.root)
        if outcome.log_tail:  # the log file is incomplete (a full disk): what it holds, then the runner's tail
            return io.BufferedReader(PartialLogThenTail(log, outcome.log_tail)) if log else outcome.log_tail
        return log

    def placeable_nodes(self) -> list[str]:
        """This machine: a local process runs nowhere else."""
        return [os.uname().nodename]

    def checkpoints(self, run_id: str) -> list[str]:
        return workspace_evidence.resumable_checkpoints(run_checkpoint_dir(self.work_root, run_id),
                                                        self.checkpoint_verify_seconds)

    def checkpoint_folder(self, run_id: str) -> Path:
        return run_checkpoint_dir(self.work_root, run_id)

    def lost_outcome(self, ref: AttemptRef) -> AttemptOutcome:
        """From the runner's report, else the entrypoint's crash report, in the attempt's folder."""
        return workspace_evidence.lost_outcome(self.workspace(ref).root)

    def stop_orphan(self, ref: AttemptRef) -> str | None:
        """Stop the entrypoint (and its process group) a killed flow process left running."""
        result = orphans.stop_leftover(self.workspace(ref).root / PROCESS_RECORD, self.capture.stop_grace(self.grace_seconds))
        return result.message if result.stopped else None

    def dump_stacks(self, run_id: str, attempt: int) -> str:
        """SIGQUIT to the running attempt's entrypoint (found and checked from its `process.json`)."""
        return orphans.ask_for_stacks(AttemptWorkspace.at(self.work_root, run_id, attempt).root / PROCESS_RECORD)

    def runs(self) -> dict[str, float]:
        return {run_id: workspace.last_change(self.work_root, run_id) for run_id in workspace.runs_in(self.work_root)}

    def attempts(self, run_id: str) -> list[int]:
        return workspace.attempts_in(self.work_root, run_id)

    def supervisor_pid(self, run_id: str, attempt: int) -> int | None:
        """The flow process that runs the attempt, from its `process.json`, if it still lives here."""
        return processes.live_supervisor(orphans.read_record(AttemptWorkspace.at(self.work_root, run_id, attempt).root / PROCESS_RECORD))

    def attempt_folder(self, run_id: str, attempt: int) -> Path:
        return AttemptWorkspace.at(self.work_root, run_id, attempt).root

    def release(self, ref: AttemptRef) -> None:
        """Nothing to clean up: the workspace stays for `trainguard run --resume`."""


def free_port() -> int:
    """A TCP port on loopback nobody listens on now, for the ranks' rendezvous (attempts side by side never share one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def outcome_of_process(result: ProcessOutcome) -> AttemptOutcome:
    """The seam's outcome from the local runner's."""
    return AttemptOutcome(
        exit_code=result.exit_code, signal=result.signal, reason=result.reason, message=result.message,
        started_at=result.started_at.isoformat(), finished_at=result.finished_at.isoformat(),
        duration_seconds=result.duration_seconds, node=os.uname().nodename,
        log_path=None if result.log_incomplete else str(result.log_path),
        # the runner's own tail is carried only where the log file cannot stand in for it (gone, cut
        # short by a full disk, or replaced by the command with something that is not its log)
        log_tail="\n".join(result.output_tail) if result.log_incomplete or not _own_file(result.log_path) else "",
        storage_problems=result.storage_problems,
    )


def _own_file(path: Path) -> bool:
    try:
        with safefiles.open_regular(path):
            return True
    except OSError:
        return False


class PartialLogThenTail(io.RawIOBase):
    """An incomplete log file read to its end, then the lines of the runner's tail it does not hold.

    A full disk cuts the log file short while the runner's in-memory tail keeps the last lines
    printed: the evidence that decides the verdict may sit in either (an early traceback in the
    file, the last error in the tail), so triage reads both, in order, in bounded memory. Where
    the file's last complete lines open the tail, they are not read twice.
    """

    _OVERLAP_WINDOW = 1 << 20  # the file's last MiB: more than the tail's lines ever span

    def __init__(self, path: Path, tail: str) -> None:
        super().__init__()
        self._file: io.BufferedReader | None = safefiles.open_regular(path)
        self._rest = _tail_after(self._file, tail.splitlines()).encode("utf-8", "replace")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._file is not None:
            count = self._file.readinto(buffer)
            if count:
                return count
            self._file.close()
            self._file = None
        chunk, self._rest = self._rest[:len(buffer)], self._rest[len(buffer):]
        buffer[:len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def _tail_after(file: io.BufferedReader, tail: list[str]) -> str:
    """The tail's lines after those the file already ends with, as text to read after the file."""
    size = file.seek(0, io.SEEK_END)
    file.seek(max(0, size - PartialLogThenTail._OVERLAP_WINDOW))
    window = file.read()
    file.seek(0)
    complete = window.endswith(b"\n")
    lines = window.decode("utf-8", "replace").splitlines()[1 if size > len(window) else 0:]
    held = (lines if complete else lines[:-1])[-TAIL_LINES:]
    overlap = next((k for k in range(min(len(held), len(tail)), 0, -1) if held[-k:] == tail[:k]), 0)
    rest = tail[overlap:]
    return ("" if complete or not window else "\n") + "".join(f"{line}\n" for line in rest)
