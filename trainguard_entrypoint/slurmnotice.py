"""Slurm's warning as a notice: what the batch shell runs when SIGTERM reaches it, before passing it on.

Slurm warns a job two ways:

- before its time limit, `sbatch --signal=B:TERM@<lead>` signals the batch shell alone, `lead`
  seconds before the limit (up to 60 s earlier: Slurm checks once a minute);
- when the job is preempted with a `GraceTime` (partition or QoS), Slurm sets its end to now plus
  the grace and sends SIGCONT and SIGTERM to the tasks of every step, not to the batch shell (which
  hears nothing until the new end). Only where the site sets `SlurmctldParameters=preempt_send_user_signal`
  (`PreemptParameters=send_user_signal` in newer Slurm) does Slurm send the job's `--signal` at once
  instead: then the batch shell alone gets it.

A `scancel` (a person's, or trainguard's own when its flow is stopped) also sends SIGTERM to the
batch shell, with Slurm's KillWait before the SIGKILL.

``python -m trainguard_entrypoint.slurmnotice STARTED LIMIT LEAD TASKS WORKSPACE`` tells them apart
by the time left to the limit the job was given (`STARTED` + `LIMIT`, epoch seconds) and
`scontrol show job`'s word on it: its state, and its `PreemptTime`, set once Slurm chose it for
preemption, with the end the preemption moved it to (the partition's GraceTime when a job without a
time limit shows no end). It writes the notice into every task's
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
from dataclasses import dataclass
from pathlib import Path

from trainguard_entrypoint.notice import Notice, current_notice, give_notice, write_notice
from trainguard_entrypoint.paths import NODE_FOLDERS, NOTICE_FILE

TIMES_ENV = "TRAINGUARD_SLURM_TIMES"  # "STARTED LIMIT_SECONDS LEAD_SECONDS", exported by the batch script
# How much earlier than its lead Slurm may send the warning (its timer runs once a minute), plus slack.
EARLY_SECONDS = 90.0
KILL_WAIT_SECONDS = 30.0  # slurm.conf's KillWait default: SIGTERM to SIGKILL after scancel


@dataclass(frozen=True)
class JobFacts:
    """Slurm's word on the job when the SIGTERM came (`scontrol show job`), where it answered."""

    state: str | None = None
    end: float | None = None  # epoch seconds; None when unknown (a job without a time limit)
    preempted_at: float | None = None  # PreemptTime: set once Slurm has chosen the job for preemption
    grace: float | None = None  # the job's partition's GraceTime, asked only when the end is unknown


def classify(now: float, started: float, limit_seconds: float, lead_seconds: float,
             facts: JobFacts = JobFacts()) -> tuple[str, float, str]:
    """(reason, deadline, source) of a SIGTERM that reached the batch shell or a task at ``now``."""
    limit_end = started + limit_seconds if limit_seconds > 0 else None
    if facts.preempted_at is not None:
        # Slurm chose the job for preemption: its end moved to then plus the partition's or QoS's GraceTime
        if facts.end is not None and facts.end > now:
            deadline = facts.end
        elif facts.grace is not None:
            deadline = max(now, facts.preempted_at + facts.grace)
        else:
            deadline = now + KILL_WAIT_SECONDS
        return "preemption", deadline, \
            f"Slurm preemption (PreemptTime set), the job's end {deadline - now:.0f}s from the notice (GraceTime)"
    if facts.state in ("CANCELLED", "COMPLETING") and (
            limit_end is None or limit_end - now > lead_seconds + EARLY_SECONDS):
        # scancel: Slurm's KillWait (30 s unless the site changed it) is all the job gets
        return "cancelled", now + min(lead_seconds or KILL_WAIT_SECONDS, KILL_WAIT_SECONDS), \
            f"Slurm SIGTERM to the batch shell, job {facts.state} (scancel), KillWait {KILL_WAIT_SECONDS:g}s assumed"
    if limit_end is not None and limit_end - now <= lead_seconds + EARLY_SECONDS:
        # the limit's own warning: the job ends at its limit, never before it
        return "time_limit", max(limit_end, now), f"Slurm --signal=B:TERM@{lead_seconds:g} before the time limit"
    return "terminated", now + min(lead_seconds or KILL_WAIT_SECONDS, KILL_WAIT_SECONDS), \
        "Slurm SIGTERM to the batch shell away from the time limit, cause unknown"


def _epoch(text: str | None) -> float | None:
    """A time as scontrol prints it (the controller's local time), in epoch seconds; None for None/Unknown."""
    try:
        return time.mktime(time.strptime((text or "").strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _fields(text: str) -> dict[str, str]:
    """`scontrol show ... --oneliner`'s Key=Value words; the first of each key (later ones may be the job's own text)."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def parse_job(text: str) -> JobFacts:
    """The facts in `scontrol show job --oneliner`'s answer."""
    fields = _fields(text)
    return JobFacts(state=fields.get("JobState") or None, end=_epoch(fields.get("EndTime")),
                    preempted_at=_epoch(fields.get("PreemptTime")))


def _scontrol(argv: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def job_facts(job_id: str, timeout: float = 10.0) -> JobFacts:
    """Slurm's word on the job now; empty facts when it does not answer. A preempted job without an end
    (no time limit) is given its partition's GraceTime."""
    if not job_id:
        return JobFacts()
    shown = _scontrol(["job", job_id], timeout)
    facts = parse_job(shown)
    if facts.preempted_at is not None and facts.end is None:
        partition = _fields(shown).get("Partition", "")
        grace = _fields(_scontrol(["partition", partition], timeout)).get("GraceTime", "") if partition else ""
        if grace.isdigit():
            return JobFacts(facts.state, None, facts.preempted_at, float(grace))
    return facts


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
    reason, deadline, source = classify(received_at, started, limit, lead, job_facts(job_id, timeout))
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
    reason, deadline, source = classify(now, started, limit, lead, job_facts(os.environ.get("SLURM_JOB_ID", "")))
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
