"""The local backend: a training attempt as a child process on the flow's own machine.

It adapts `local.LocalProcessRunner` (the process, its limits, its stop) and
`evidence.collect_local_evidence` (the workspace's files) to the `backend.Backend` seam. The
attempt's folder is on this machine, so the flow reads its files directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from trainguard.core import evidence, orphans
from trainguard.core.backend import AttemptOutcome, AttemptRef, CollectedEvidence, Launch, LineSink, container_env
from trainguard.core.local import LocalProcessRunner, ProcessOutcome
from trainguard.core.manifest import attempt_prefix
from trainguard.core.stores import EvidenceStore
from trainguard.core.triage.signals import Signals
from trainguard.core.workspace import AttemptWorkspace, run_checkpoint_dir

KIND = "local"


@dataclass(frozen=True)
class LocalBackend:
    """Runs attempts as local processes under the container entrypoint, in `work_root`."""

    work_root: Path
    grace_seconds: float = 10.0
    python: str = sys.executable
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
        ws = self.workspace(ref)
        user_env = container_env(launch, workspace=str(ws.root), checkpoint_dir=str(ws.checkpoint_dir))
        if launch.workdir:
            user_env["TRAINGUARD_WORKDIR"] = os.path.abspath(launch.workdir)
        runner = LocalProcessRunner(python=self.python, grace_seconds=self.grace_seconds, on_line=on_line)
        result = runner.run(list(launch.command), workspace=ws, env=user_env,
                            deadline_seconds=launch.deadline_seconds, stall_seconds=launch.stall_seconds)
        return outcome_of(result)

    def collect_evidence(
        self, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None,
        extra: Mapping[str, bytes] | None = None,
    ) -> CollectedEvidence:
        ws = self.workspace(ref)
        failures = outcome.storage_problems if outcome is not None else ()
        manifest = evidence.collect_local_evidence(ws, store, extra=extra, write_failures=failures)
        return CollectedEvidence(manifest, store.describe(attempt_prefix(ref.run_id, ref.attempt)))

    def signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> Signals:
        log = Path(outcome.log_path) if outcome.log_path else self.workspace(ref).log_path
        # no log path with a tail: the log file is incomplete (a full disk), the runner's tail is not
        use_tail = outcome.log_tail and (outcome.log_path is None or not log.exists())
        return Signals(
            exit_code=outcome.exit_code, reason=outcome.reason, conditions=outcome.conditions,
            events=outcome.events, log=outcome.log_tail if use_tail else (log if log.exists() else None),
        )

    def checkpoints(self, run_id: str) -> list[str]:
        folder = run_checkpoint_dir(self.work_root, run_id)
        return [str(path) for path in evidence.newest_checkpoints(folder)] if folder.is_dir() else []

    def stop_orphan(self, ref: AttemptRef) -> str | None:
        """Stop the entrypoint (and its process group) a killed flow process left running."""
        result = orphans.stop_leftover(self.workspace(ref).process_path, self.grace_seconds)
        return result.message if result.stopped else None

    def release(self, ref: AttemptRef) -> None:
        """Nothing to clean up: the workspace stays for `trainguard run --resume`."""


def outcome_of(result: ProcessOutcome) -> AttemptOutcome:
    """The seam's outcome from the local runner's."""
    return AttemptOutcome(
        exit_code=result.exit_code, signal=result.signal, reason=result.reason, message=result.message,
        started_at=result.started_at.isoformat(), finished_at=result.finished_at.isoformat(),
        duration_seconds=result.duration_seconds, node=os.uname().nodename,
        log_path=None if result.log_incomplete else str(result.log_path),
        # the runner's own tail is carried only where the log file cannot stand in for it
        log_tail="\n".join(result.output_tail) if result.log_incomplete or not result.log_path.exists() else "",
        storage_problems=result.storage_problems,
    )
