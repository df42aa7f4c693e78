"""Slurm's warning as a notice: what the batch shell runs when SIGTERM reaches it, before passing it on.

Slurm warns a job two ways:

- before its time limit, `sbatch --signal=B:TERM@<lead>` signals the batch shell alone, `lead`
  seconds before the limit (up to 60 s earlier: Slurm checks once a minute);
- when the job is preempted with a `GraceTime` (partition or QoS), Slurm sets its end to now plus
  the grace and sends SIGCONT and SIGTERM to the tasks of every step, not to the batch shell (which
  hears nothing until the new end). Only where the site sets `SlurmctldParameters=preempt_send_user_signal`
  does Slurm send the job's `--signal` at once instead: then the batch shell alone gets it.

A `scancel` (a person's, or trainguard's own when its flow is stopped) also sends SIGTERM to the
batch shell, with Slurm's KillWait before the SIGKILL.

``python -m trainguard_entrypoint.slurmnotice STARTED LIMIT LEAD TASKS WORKSPACE`` tells them apart
by the time left to the limit the job was given (`STARTED` + `LIMIT`, epoch seconds) and squeue's
word on the job (its state; its end time, which a preemption moves). It writes the notice into every task's
folder (task 0's is `WORKSPACE`, task N's `WORKSPACE/tasks/N`), or refines the one a task's
entrypoint wrote first (a preemption's or a scancel's SIGTERM reaches it directly), then the batch
shell passes the stop on to the tasks. Stdlib only; it never fails the batch shell: a problem is one line on stderr.

A preemption's SIGTERM that reaches the tasks alone is told apart by each task's entrypoint
(`task_notice`), from the same facts: the batch script exports its start, limit and lead as
`TRAINGUARD_SLURM_TIMES`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainguard_entrypoint.notice import Notice, current_notice, give_notice, write_notice
from trainguard_entrypoint.paths import NODE_FOLDERS, NOTICE_FILE

TIMES_ENV = "TRAINGUARD_SLURM_TIMES"  # "STARTED LIMIT_SECONDS LEAD_SECONDS", exported by the batch script
# How much earlier than its lead Slurm may send the warning (its timer runs once a minute), plus slack.
EARLY_SECONDS = 90.0
KILL_WAIT_SECONDS = 30.0  # slurm.conf's KillWait default: SIGTERM to SIGKILL after scancel


def classify(now: float, started: float, limit_seconds: float, lead_seconds: float,
             state: str | None = None, end: float | None = None) -> tuple[str, float, str]:
    """(reason, deadline, source) of a SIGTERM that reached the batch shell at ``now``.

    ``state`` and ``end`` are squeue's word on the job at that moment (its state, its end time in
    epoch seconds), where it answered.
    """
    limit_end = started + limit_seconds if limit_seconds > 0 else None
    if state in ("CANCELLED", "COMPLETING") and (limit_end is None or limit_end - now > lead_seconds + EARLY_SECONDS):
        # scancel: Slurm's KillWait (30 s unless the site changed it) is all the job gets
        return "cancelled", now + min(lead_seconds or KILL_WAIT_SECONDS, KILL_WAIT_SECONDS), \
            f"Slurm SIGTERM to the batch shell, job {state} (scancel), KillWait {KILL_WAIT_SECONDS:g}s assumed"
    if limit_end is not None and limit_end - now <= lead_seconds + EARLY_SECONDS:
        # the limit's own warning: the job ends at its limit, never before it
        return "time_limit", max(limit_end, now), f"Slurm --signal=B:TERM@{lead_seconds:g} before the time limit"
    if end is not None and end > now and (limit_end is None or end < limit_end - 1):
        # a preemption: Slurm moved the job's end to now plus the partition's or QoS's GraceTime
        return "preemption", end, f"Slurm preemption, the job's end moved to {end - now:.0f}s from the notice (GraceTime)"
    return "terminated", now + min(lead_seconds or KILL_WAIT_SECONDS, KILL_WAIT_SECONDS), \
        "Slurm SIGTERM to the batch shell away from the time limit, cause unknown"


def job_facts(job_id: str, timeout: float = 10.0) -> tuple[str | None, float | None]:
    """squeue's state and end time (epoch seconds, from the controller's local time) of the job, or Nones."""
    if not job_id:
        return None, None
    try:
        done = subprocess.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%e"], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None, None
    state, _, end_text = done.stdout.strip().partition("|")
    try:
        end = time.mktime(time.strptime(end_text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        end = None
    return (state.strip() or None), end


def task_notice(environ: Mapping[str, str], received_at: float, timeout: float = 5.0) -> Notice | None:
    """The notice for a SIGTERM that reached a task's entrypoint, where Slurm's word on the job says it is
    a preemption (which signals the tasks, not the batch shell); None outside a trainguard batch job, or
    for any other SIGTERM (the batch shell hears of those itself, and refines the task's notice)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    try:
        started, limit, lead = (float(word) for word in environ.get(TIMES_ENV, "").split())
    except ValueError:
        return None
    if not job_id:
        return None
    reason, deadline, source = classify(received_at, started, limit, lead, *job_facts(job_id, timeout))
    if reason != "preemption":
        return None
    return Notice(reason, received_at, deadline, f"{source}; SIGTERM to the task")


def task_folders(workspace: Path, tasks: int) -> list[Path]:
    """Each task's folder: task 0 the attempt's own, task N `tasks/N` in it."""
    return [workspace] + [workspace / NODE_FOLDERS / str(n) for n in range(1, tasks)]


def give(workspace: Path, tasks: int, reason: str, deadline: float, source: str, now: float,
         started: float) -> list[Path]:
    """Write the notice into each task's folder; the files written.

    A scancel or a preemption signals the tasks at the same moment as the batch shell, so a task's
    entrypoint may have written its own notice first, knowing only that a SIGTERM came
    (`terminated`): that one is refined with the reason, keeping when it was given and the earlier
    of the two deadlines (the training may have read it already). Any other notice given since the
    job started is left as it is.
    """
    written = []
    for folder in task_folders(workspace, tasks):
        path = folder / NOTICE_FILE
        existing = current_notice({"TRAINGUARD_NOTICE_FILE": str(path)}, not_before=started)
        if existing is None:
            give_notice(path, reason, max(deadline - now, 0.0), source, now=now)
        elif existing.reason == "terminated" and reason != "terminated":
            write_notice(path, Notice(reason, existing.given_at, min(existing.deadline, deadline),
                                      f"{source}; first said by: {existing.source}"))
        else:
            continue
        written.append(path)
    return written


def main(argv: Sequence[str]) -> int:
    try:
        started, limit, lead = (float(a) for a in argv[:3])
        tasks, workspace = int(argv[3]), Path(argv[4])
    except (ValueError, IndexError):
        print("trainguard-slurmnotice: usage: STARTED LIMIT_SECONDS LEAD_SECONDS TASKS WORKSPACE", file=sys.stderr)
        return 2
    now = time.time()
    reason, deadline, source = classify(now, started, limit, lead, *job_facts(os.environ.get("SLURM_JOB_ID", "")))
    try:
        written = give(workspace, max(tasks, 1), reason, deadline, source, now, started)
    except OSError as exc:
        print(f"trainguard-slurmnotice: could not write the notice ({reason}): {exc}", file=sys.stderr)
        return 1
    print(f"trainguard-slurmnotice: {reason}, deadline in {deadline - now:.0f}s, notice in {len(written)} "
          "task folder(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
