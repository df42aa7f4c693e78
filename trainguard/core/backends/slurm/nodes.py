"""The nodes of a Slurm attempt as triage reads them: each task's folder, its log, exit and error files.

Task 0 writes into the attempt's own folder, task N into `tasks/N` (the batch script's wrapper
moves `TRAINGUARD_WORKSPACE` there); with one task per node, the task's index is its node id,
which is the node rank torchrun's agent there was given. Reading only: what the job's folders
hold is the job's, so files are read bounded and never through a link (`backends.torchrun`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainguard_entrypoint.files import read_json_object

from trainguard.core.backends import forensics, rankstacks, torchrun, workspace
from trainguard.core.backends.capabilities import NodeEvidence
from trainguard.core.backends.slurm import continuation, job
from trainguard.core.backends.slurm import evidence as slurm_evidence
from trainguard.core.backends.slurm.client import SlurmClient, SlurmError
from trainguard.core.backends.workspace import AttemptWorkspace
from trainguard.core.triage.signals import Signals


def node_folders(root: Path) -> list[tuple[int, Path]]:
    """Each task's folder with its index: the attempt's own for task 0, `tasks/N` for the others."""
    others = [(int(p.name), p) for p in (root / workspace.NODE_FOLDERS).glob("*") if p.name.isdigit()]
    return [(0, root), *sorted(others)]


def last_progress(root: Path, clock: Callable[[], float]) -> float:
    """When a task's entrypoint last saw its rank logs or checkpoints move (its `progress.json`), on
    `clock`; minus infinity when none did. A job that logs only to files is not silent."""
    at = forensics.last_progress([folder for _, folder in node_folders(root)])
    return -float("inf") if at is None else clock() - max(0.0, time.time() - at)


def take_stacks(root: Path, capture: forensics.StackCapture, clock: Callable[[], float],
                sleep: Callable[[float], None]) -> None:
    """Before a stall's cancel, whose SIGTERM reaches every process of the step at once: every task's
    ranks' stacks, unless the entrypoint took them already as the window ran out, waited for within the
    sweep's bound (through the `dump-stacks` file each task's entrypoint polls on the shared folder)."""
    if capture.sweep_seconds <= 0 or forensics.stacks_taken(root) is not None:
        return
    since = time.time() - 1.0  # the node's clock may be a little behind this machine's
    forensics.request_stacks([folder for _, folder in node_folders(root)])
    forensics.wait_for_stacks(root, since, capture.sweep_seconds + 2.0, clock=clock, sleep=sleep)


def ask_for_stacks(client: SlurmClient, ws: AttemptWorkspace) -> str:
    """Write the `dump-stacks` file into every task's folder of the attempt's job, if the job runs.

    Raises:
        forensics.NotRunning: No job was recorded, Slurm cannot say, or the job is not running.
    """
    job_id = continuation.recorded_job_id(ws)
    if job_id is None:
        raise forensics.NotRunning(f"no Slurm job recorded in {ws.root}: the attempt was never submitted")
    try:
        state = client.state(job_id)
    except SlurmError as exc:
        raise forensics.NotRunning(f"could not ask Slurm about job {job_id}: {exc}") from exc
    if state != "RUNNING":
        raise forensics.NotRunning(f"Slurm job {job_id} is {state or 'gone from Slurm'}, not running")
    folders = [folder for _, folder in node_folders(continuation.job_workspace(ws).root)]
    if problems := forensics.request_stacks(folders):
        raise forensics.NotRunning(f"could not ask job {job_id}'s entrypoints: {problems[0]}")
    return f"asked the entrypoints of Slurm job {job_id} ({len(folders)} task folder(s)) for every rank's stack"


def failed_node(client: SlurmClient, ws: AttemptWorkspace, hosts: list[str]) -> str | None:
    """The job's node Slurm marked down or failing (its `scontrol show node` kept), else the first."""
    for node in hosts:
        try:
            text = client.show_node(node)
        except SlurmError:
            continue
        slurm_evidence.keep(ws, f"scontrol-show-node-{node}.txt", text)
        if any(word in text for word in ("State=DOWN", "+DRAIN", "State=FAIL", "NOT_RESPONDING", "State=DRAIN")):
            return node
    return hosts[0] if hosts else None


def node_list(root: Path) -> str:
    """The job's NodeList as `scontrol show job` said at its end (kept in the attempt's folder)."""
    try:
        text = (root / workspace.SLURM_KEPT / workspace.SLURM_JOB_SHOWN).read_text("utf-8", "replace")
    except OSError:
        return ""
    return next((word.removeprefix("NodeList=") for word in text.split() if word.startswith("NodeList=")), "")


def node_evidence(ws: AttemptWorkspace, reason: str, hostnames: Callable[[], list[str]]) -> list[NodeEvidence]:
    """One entry per task of a one-task-per-node job: its own log, exit status and error files, on its host.

    Args:
        ws: The attempt's folders (task 0's).
        reason: How the job ended, as the backend's outcome says; it is task 0's, for the others say
            only what their own folders do.
        hostnames: The job's hosts in node-id order (asked only when there are several tasks).
    """
    folders = node_folders(ws.root)
    hosts = hostnames() if len(folders) > 1 else []
    found = []
    budget = rankstacks.StackBudget()
    for index, folder in folders:
        crash = read_json_object(folder / workspace.CRASH_REPORT) or {}
        code = crash.get("exit_code") if isinstance(crash.get("exit_code"), int) else None
        log = folder / workspace.LOGS / workspace.log_name(ws.run_id, ws.attempt)
        host = hosts[index] if index < len(hosts) else None
        signals = Signals(exit_code=code, reason=reason if index == 0 else None, log=log if log.is_file() else None,
                          error_files=torchrun.nodes_error_files([(index, folder)]),
                          stacks=rankstacks.read_stacks(folder, host, budget))
        found.append(NodeEvidence(index, signals, node=hosts[index] if index < len(hosts) else None,
                                  instance=f"task {index}"))
    return found
