"""What one attempt is as a Slurm batch job, as pure functions: its name, options, script and outcome.

The job name and comment are derived from (run, attempt) and the shared folder, so a resubmitted
attempt finds the job it already launched. `sbatch_options` turns the backend's settings and a
`Launch` into `sbatch` options; `batch_script` writes the script that runs the stdlib entrypoint
under `srun` on every task; `termination` reads Slurm's job state as a termination reason triage
knows. Running commands is ``client``'s; supervising and collecting is ``backend``'s.
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard_entrypoint.slurmnotice import TIMES_ENV

from trainguard.core.backends import workspace
from trainguard.core.backends.base import CANCELLED, COMPLETED, ERROR, Launch
from trainguard.core.backends.slurm.client import JobInfo
from trainguard.core.backends.waits import span
from trainguard.core.backends.workspace import NODE_FOLDERS, SLURM_SIGNAL_MARKER, slurm_output

# States in which a job has not started yet, or waits to start again (squeue's long names).
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                            "SUSPENDED"})

# Slurm's words for how a job ended, as the termination reasons the triage rules know.
STATE_REASONS = {
    "NODE_FAIL": "NodeLost",
    "BOOT_FAIL": "NodeLost",
    "PREEMPTED": "Preempted",
    "TIMEOUT": "DeadlineExceeded",
    "DEADLINE": "DeadlineExceeded",
    "OUT_OF_MEMORY": "OOMKilled",
    "CANCELLED": CANCELLED,
}
STALLED = "Stalled"
UNREACHABLE = "ControllerUnreachable"  # the controller stopped answering while the job was followed
# slurmstepd's words in the job's stderr when it killed a step over its memory limit: with cgroups
# Slurm also says OUT_OF_MEMORY; with jobacct_gather's OverMemoryKill the job just ends FAILED.
_MEMORY_KILLED = re.compile(
    rb"slurmstepd\S*: error: (?:.*exceeded memory limit|Exceeded job memory limit|Detected \d+ oom[-_]kill event)"
)
# Options trainguard sets itself; a user's extra option must not silently change them.
_OWNED = ("--job-name", "-J", "--comment", "--output", "-o", "--error", "-e", "--requeue", "--no-requeue",
          "--parsable", "--export", "--wrap", "--chdir", "-D", "--signal", "--time", "-t", "--exclude", "-x")
# Each task's folder, and torchrun's logs and error file in it (moved with it where they were
# trainguard's defaults); the node rank is Slurm's node id, so each node's torchrun agent knows its place.
_TASK_WRAPPER = (
    'if [ "${SLURM_PROCID:-0}" != 0 ]; then base="$TRAINGUARD_WORKSPACE"; '
    f'TRAINGUARD_WORKSPACE="$base/{NODE_FOLDERS}/$SLURM_PROCID"; '
    f'[ "$PET_LOG_DIR" = "$base/{workspace.RANKS}" ] && PET_LOG_DIR="$TRAINGUARD_WORKSPACE/{workspace.RANKS}"; '
    f'[ "$TORCHELASTIC_ERROR_FILE" = "$base/{workspace.TORCHELASTIC}/{workspace.TORCHELASTIC_ERROR}" ] && '
    f'TORCHELASTIC_ERROR_FILE="$TRAINGUARD_WORKSPACE/{workspace.TORCHELASTIC}/{workspace.TORCHELASTIC_ERROR}"; '
    'export TRAINGUARD_WORKSPACE PET_LOG_DIR TORCHELASTIC_ERROR_FILE; fi; '
    'NODE_RANK="${SLURM_NODEID:-0}"; PET_NODE_RANK="$NODE_RANK"; export NODE_RANK PET_NODE_RANK; exec "$@"'
)
# The rendezvous: the first node of the allocation (by its NodeAddr, which the other nodes reach it by)
# and a port of the job's own, so two jobs sharing a node never meet on one.
_RENDEZVOUS = [
    'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)',
    'addr=$(scontrol show node "$first" 2>/dev/null | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
    'if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ] && [ -n "${addr:-$first}" ]; then '
    'MASTER_ADDR="${addr:-$first}"; PET_MASTER_ADDR="$MASTER_ADDR"; export MASTER_ADDR PET_MASTER_ADDR; fi',
    'MASTER_PORT=$((20000 + ${SLURM_JOB_ID:-0} % 20000)); PET_MASTER_PORT="$MASTER_PORT"; '
    'export MASTER_PORT PET_MASTER_PORT',
]


@dataclass(frozen=True)
class JobSettings:
    """The site's part of an attempt's job: where and with what it runs (from the backend block)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpu_option: str = "gpus"  # "gpus" (--gpus=N in all) or "gres" (--gres=gpu[:type]:N per node)
    gpu_type: str | None = None
    gpus_per_node: int | None = None  # None: the spec's GPUs, spread over the nodes
    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    memory_mb: int | None = None  # per node; scaled by the launch's memory_factor
    signal_lead_seconds: int = 120
    extra_options: tuple[str, ...] = ()

    def check(self) -> None:
        """Raise a one-line ValueError naming the field and the fix for anything sbatch would refuse."""
        if self.gpu_option not in ("gpus", "gres"):
            raise ValueError(f"gpu_option {self.gpu_option!r}: use 'gpus' (--gpus) or 'gres' (--gres)")
        for name in ("nodes", "ntasks_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for option in self.extra_options:
            if not option.startswith("-") or "\n" in option or "\0" in option:
                raise ValueError(f"extra_sbatch_options: {option!r} is not an sbatch option; write e.g. '--constraint=a100'")
            flag = option.split("=", 1)[0]
            if flag in _OWNED:
                raise ValueError(f"extra_sbatch_options: {flag} is set by trainguard itself; remove it")


def job_name(run_id: str, attempt: int) -> str:
    """The attempt's job name: the same for every submission of this (run, attempt)."""
    return f"tg-{run_id}-a{attempt}"


def job_comment(run_id: str, attempt: int, shared_folder: str) -> str:
    """The comment that tells this attempt's job apart from a namesake of another installation."""
    place = hashlib.sha256(shared_folder.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"trainguard:{run_id}:attempt-{attempt}:shared-{place}"  # no '=': scontrol's key=value text stays readable


def time_limit_minutes(deadline_seconds: float | None) -> int | None:
    """Slurm counts time limits in whole minutes; round the spec's deadline up."""
    return None if deadline_seconds is None else max(1, math.ceil(deadline_seconds / 60))


def _gpu_options(settings: JobSettings, gpus: int, nodes: int | None = None) -> list[str]:
    """GPU options; ``nodes`` set: the spec's nodes, each holding ``gpus`` (else the block's, sharing them)."""
    if nodes is not None:
        per_node, count = gpus, nodes
    else:
        count = settings.nodes
        per_node = settings.gpus_per_node if settings.gpus_per_node is not None else math.ceil(gpus / count)
    if per_node <= 0:
        return []
    if settings.gpu_option == "gres":
        kind = f"gpu:{settings.gpu_type}" if settings.gpu_type else "gpu"
        return [f"--gres={kind}:{per_node}"]
    kind = f"{settings.gpu_type}:" if settings.gpu_type else ""
    return [f"--gpus={kind}{per_node * count}"]


def signal_lead(settings: JobSettings, launch: Launch) -> int:
    """Seconds before the time limit Slurm warns the batch shell: the spec's notice grace, else the block's."""
    return math.ceil(launch.notice_grace_seconds) if launch.notice_grace_seconds else settings.signal_lead_seconds


def sbatch_options(
    settings: JobSettings, launch: Launch, *, workspace: str, shared_folder: str, exclude: Sequence[str] = ()
) -> list[str]:
    """The `sbatch` options of one attempt (the script path and `--parsable` come on top)."""
    settings.check()
    options = [
        f"--job-name={job_name(launch.run_id, launch.attempt)}",
        f"--comment={job_comment(launch.run_id, launch.attempt, shared_folder)}",
        "--no-requeue",  # the flow alone owns retries
        f"--output={workspace}/{slurm_output('%j', 'out')}", f"--error={workspace}/{slurm_output('%j', 'err')}",
        f"--chdir={launch.workdir or workspace}", "--export=ALL",
    ]
    multi = launch.nodes > 1  # the spec's nodes: one torchrun agent per node; else the block's shape
    options += ([f"--nodes={launch.nodes}", "--ntasks-per-node=1"] if multi
                else [f"--nodes={settings.nodes}", f"--ntasks-per-node={settings.ntasks_per_node}"])
    limit = time_limit_minutes(launch.deadline_seconds)
    if limit is not None:
        options.append(f"--time={limit}")
        lead = signal_lead(settings, launch)
        if 0 < lead < limit * 60:
            options.append(f"--signal=B:TERM@{lead}")
    for flag, value in (("--partition", settings.partition), ("--account", settings.account), ("--qos", settings.qos)):
        if value:
            options.append(f"{flag}={value}")
    options += _gpu_options(settings, launch.gpus, launch.nodes if multi else None)
    if settings.cpus_per_task:
        options.append(f"--cpus-per-task={settings.cpus_per_task}")
    if settings.memory_mb:
        options.append(f"--mem={math.ceil(settings.memory_mb * max(1.0, launch.memory_factor))}M")
    if exclude:
        options.append(f"--exclude={','.join(exclude)}")
    return [*options, *settings.extra_options]


def batch_script(*, python: str, entrypoint: str, command: Sequence[str], workspace: str, run_id: str, attempt: int,
                 limit_seconds: int = 0, lead_seconds: int = 0) -> str:
    """The batch script: `srun` starts the entrypoint on every task; Slurm's warning signal is noted,
    given to every task as a notice (`trainguard_entrypoint.slurmnotice`) and passed on.

    Task 0 uses the attempt's folder, task N its `tasks/N` subfolder, so every task's output is
    teed and its crash report kept. The entrypoint reads its options from `TRAINGUARD_*`
    variables, which the job's environment carries. ``limit_seconds`` and ``lead_seconds`` are the
    job's `--time` and `--signal` lead (0: none), which tell the limit's warning from a preemption.
    """
    argv = ["srun", "--kill-on-bad-exit=1", "/bin/sh", "-c", _TASK_WRAPPER, "trainguard-task", python, entrypoint,
            "--", *command]
    marker = f"{workspace}/{SLURM_SIGNAL_MARKER}"
    return "\n".join([
        "#!/bin/bash",
        f"# trainguard: run {shlex.quote(run_id)}, attempt {attempt}. Generated; Slurm keeps a copy with the job.",
        "# Slurm's warning before the time limit (--signal=B:TERM@...) or a preemption reaches this shell: note it,",
        "# write the notice (reason and deadline) into every task's folder, then pass the stop on to the tasks",
        "# through Slurm (not the batch shell again), so each entrypoint gets SIGTERM, finds the notice and passes",
        "# it to the training; srun itself would kill its tasks on SIGTERM. Only if scancel fails is srun signalled.",
        f"marker={shlex.quote(marker)}",
        f"entrypoint={shlex.quote(entrypoint)}; python={shlex.quote(python)}",
        f"started=$(date +%s); limit={int(limit_seconds)}; lead={int(lead_seconds)}",
        "# a preemption signals the tasks alone: each task's entrypoint tells it from the limit's warning by these",
        f'{TIMES_ENV}="$started $limit $lead"; export {TIMES_ENV}',
        "step=",
        "trap 'date -u +%Y-%m-%dT%H:%M:%SZ >> \"$marker\"; "
        "PYTHONPATH=\"$entrypoint\" \"$python\" -m trainguard_entrypoint.slurmnotice \"$started\" \"$limit\" \"$lead\" "
        "\"${SLURM_NTASKS:-1}\" "
        "\"$TRAINGUARD_WORKSPACE\"; "
        "[ -n \"$step\" ] && { scancel --signal=TERM \"$SLURM_JOB_ID\" "
        "2>/dev/null || kill -TERM \"$step\" 2>/dev/null; }' TERM",
        *_RENDEZVOUS,
        " ".join(shlex.quote(a) for a in argv) + " &",
        "step=$!",
        "while :; do",
        '  wait "$step"; rc=$?',
        '  kill -0 "$step" 2>/dev/null || break  # a trapped signal interrupted the wait: wait again',
        "done",
        'exit "$rc"',
        "",
    ])


def memory_killed(job_stderr: bytes) -> bool:
    """Whether slurmstepd says (in the job's stderr) that it killed a step for exceeding its memory."""
    return _MEMORY_KILLED.search(job_stderr) is not None


def termination(
    state: str, exit_code: int | None, *, signalled: bool, stopped_for: str | None, memory_exceeded: bool = False,
    notice_reason: str | None = None,
) -> str:
    """The termination reason for a job that ended in `state`.

    Args:
        state: Slurm's job state (COMPLETED, FAILED, TIMEOUT, NODE_FAIL, ...).
        exit_code: The command's exit status, shell style.
        signalled: The batch shell noted a SIGTERM: Slurm's warning before the time limit, or a
            preemption's where the site sends the job's `--signal` on preemption.
        stopped_for: Why trainguard itself cancelled the job (a stall, the flow being stopped), if it did.
        memory_exceeded: slurmstepd killed a step over the job's memory limit (`memory_killed`).
        notice_reason: The reason of the notice the attempt's first task was given, if any.
    """
    if state == "CANCELLED" and stopped_for:
        return stopped_for
    if state in STATE_REASONS:
        return STATE_REASONS[state]
    if state == "COMPLETED" and exit_code == 0:
        return COMPLETED
    if memory_exceeded:
        return STATE_REASONS["OUT_OF_MEMORY"]
    if notice_reason == "preemption":
        # it stopped on the preemption's notice before its new end: Slurm records the job as its exit
        # status left it (FAILED, COMPLETED), PREEMPTED only when it had to kill it at that end
        return STATE_REASONS["PREEMPTED"]
    if signalled:
        return "DeadlineExceeded"  # it stopped on Slurm's warning before its time limit
    return ERROR


def exit_status(crash: dict[str, Any] | None, info: JobInfo | None) -> tuple[int | None, int | None]:
    """The command's own status from the crash report; else the batch script's as Slurm saw it."""
    if crash is not None and isinstance(crash.get("exit_code"), int):
        sig = crash.get("signal")
        return crash["exit_code"], sig if isinstance(sig, int) else None
    if info is None:
        return None, None
    if info.signal:
        return 128 + info.signal, info.signal
    return info.exit_code, None


def ended_message(job_id: str, info: JobInfo | None, code: int | None, sig: int | None, stopped_for: str | None,
                  signalled: bool, notice_reason: str | None = None) -> str:
    """One line on how the job ended: its state and reason, node, exit status, and why if trainguard or Slurm stopped it."""
    if info is None:
        return f"Slurm job {job_id} ended, but Slurm no longer has its record; exit code {code}"
    why = f", reason {info.reason}" if info.reason and info.reason != "None" else ""
    text = f"Slurm job {job_id} ended {info.state}{why} on {info.node_list or 'no node'}; exit code {code}"
    if sig:
        text += f" (signal {sig})"
    if stopped_for == STALLED:
        text += "; cancelled by trainguard: no new log output within the stall window"
    elif notice_reason == "preemption" and info.state not in ("COMPLETED", "CANCELLED"):
        text += "; Slurm preempted it (its end moved to the GraceTime) and the command stopped on the notice"
    elif signalled and info.state not in ("COMPLETED", "CANCELLED"):  # scancel's TERM reaches the trap too
        text += "; Slurm warned of its time limit (--signal) and the command stopped"
    return text


def lost_message(job_id: str, silent_seconds: float, controller: str, error: str) -> str:
    """One line for a controller that went silent while its job was followed: what happened and the way out."""
    return (f"Slurm's controller did not answer for {silent_seconds:.0f}s while trainguard followed job {job_id} "
            f"({controller}; last error: {error}); the job may still be running: bring slurmctld back "
            f"(`scontrol ping`, its log), then run this attempt again to adopt job {job_id}, or `scancel {job_id}`")


def odd_answers_message(job_id: str, count: int, error: str) -> str:
    """One line for squeue failing oddly (not "unreachable", not "no such job") `count` times in a row."""
    return (f"squeue answered {count} times in a row with an error while trainguard followed job {job_id} "
            f"(last: {error}); the job may still be running: check `squeue --jobs={job_id}` and slurmctld's log, "
            f"then run this attempt again to adopt job {job_id}, or `scancel {job_id}`")


def unanswered_submit_message(attempt: int, name: str, controller: str, error: str) -> str:
    """One line for a controller that did not answer at submission: nothing is known to run for the attempt."""
    return (f"Slurm's controller did not answer when trainguard went to submit attempt {attempt} as job {name} "
            f"({controller}; error: {error}); bring slurmctld back (`scontrol ping`, its log): the next attempt "
            f"adopts a job sbatch may have queued under that name, or submits one")


def waiting_line(job_id: str, state: str | None, reason: str, waited: float, controller_timeout_seconds: float) -> str:
    """trainguard's line about a job that does not run yet (`WAITING_STATES`), or that squeue says nothing of."""
    if state == "UNKNOWN":
        return (f"trainguard: waiting {span(waited)} (of {span(controller_timeout_seconds)}) for the Slurm controller "
                f"to answer squeue about job {job_id}")
    why = f" ({reason})" if reason and reason != "None" else ""
    return f"trainguard: waiting {span(waited)} for Slurm job {job_id} to start: {state}{why}"
