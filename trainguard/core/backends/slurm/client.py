"""The Slurm adapter: the one module that runs Slurm's commands and reads their answers.

`SlurmClient` wraps `sbatch --parsable`, `squeue`, `scontrol`, `sacct`, `sinfo` and `scancel`
behind small methods that return plain values, and translates a command's failure once, here, into
`SlurmError`'s tree: `SlurmUnavailable` (the controller cannot be reached, the command timed out:
worth retrying), `JobNotFound` (Slurm no longer knows the job) and `SlurmRejected` (the request
itself is wrong: a bad partition, account or option). The command runner is injected, so the
supervision loop and the tests need no patching. What a job *means* for an attempt (its state as a
termination reason, the batch script) lives in ``job``; the backend seam in ``backend``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

# Job states after which a job never runs again (squeue's and sacct's long names).
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})
_UNAVAILABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|Connection refused|"
    r"Transport endpoint|Communication connection failure|Slurm temporarily unable|try again later",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(r"Invalid job id specified|Job ID \S+ not found|not found", re.IGNORECASE)
# What `accounting` asks sacct for: the record of the job and every step.
# JobName comes last: it is the one column a user's text reaches, so a '|' in it shifts nothing else.
ACCOUNTING_FIELDS = ("JobID", "State", "ExitCode", "DerivedExitCode", "NodeList", "Start", "End", "Elapsed",
                     "MaxRSS", "MaxRSSNode", "ReqMem", "AllocTRES", "Reason", "JobName")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=")
_MAX_TEXT = 1_000_000  # a runaway command output is cut, never read without bound into memory


class SlurmError(Exception):
    """A Slurm command failed; the message names the command and what it said."""


class SlurmUnavailable(SlurmError):
    """Slurm could not be reached (controller down, timeout): the same request may work later."""


class SlurmRejected(SlurmError):
    """Slurm refused the request itself (bad partition, account, option): retrying will not help."""


class JobNotFound(SlurmError):
    """Slurm does not know the job (any more)."""


@dataclass(frozen=True)
class CommandResult:
    """What a command returned."""

    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], Mapping[str, str] | None, float], CommandResult]


def run_command(argv: Sequence[str], env: Mapping[str, str] | None, timeout_seconds: float) -> CommandResult:
    """Run one command to completion (the default `Runner`): its exit status and text output."""
    try:
        done = subprocess.run(
            list(argv), env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=timeout_seconds, check=False,
        )
    except FileNotFoundError as exc:
        raise SlurmUnavailable(f"{argv[0]}: command not found; install Slurm's client commands") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"{argv[0]}: no answer within {timeout_seconds:g}s") from exc
    return CommandResult(
        done.returncode, done.stdout[:_MAX_TEXT].decode("utf-8", "replace"), done.stderr[:_MAX_TEXT].decode("utf-8", "replace")
    )


def parse_key_values(text: str) -> dict[str, str]:
    """`scontrol show -o` output (`Key=value Key2=value two ...`) as a dict; values may hold spaces."""
    matches = list(_KEY.finditer(text))
    values: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        values.setdefault(match.group(1), text[match.end():end].strip())
    return values


def accounting_rows(text: str) -> list[dict[str, str]]:
    """`sacct --parsable2` output (header first) as one dict per job or step row."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    return [dict(zip(header, line.split("|"), strict=False)) for line in lines[1:]]


def accounting_settled(rows: list[dict[str, str]], job_id: str) -> bool:
    """Whether the job's row and all its steps' rows are in a terminal state (the record is final)."""
    states = [row.get("State", "").split(" ")[0] for row in rows]
    job_rows = [row for row in rows if row.get("JobID") == job_id]
    return bool(job_rows) and all(state in TERMINAL_STATES for state in states)


def parse_exit_code(value: str | None) -> tuple[int | None, int | None]:
    """Slurm's `code:signal` ExitCode as (exit code, signal); None where absent or unreadable."""
    if not value or ":" not in value:
        return None, None
    code, _, sig = value.partition(":")
    return (int(code) if code.isdigit() else None), (int(sig) if sig.isdigit() and sig != "0" else None)


@dataclass(frozen=True)
class QueuedJob:
    """One line of `squeue` for this user's jobs: id, state, name and comment."""

    job_id: str
    state: str
    name: str
    comment: str


@dataclass(frozen=True)
class JobInfo:
    """One job as `scontrol show job` describes it."""

    job_id: str
    state: str
    reason: str
    exit_code: int | None
    signal: int | None
    node_list: str
    start_time: str | None
    end_time: str | None
    run_seconds: float
    fields: Mapping[str, str] = field(default_factory=dict)
    text: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def _slurm_time(value: str | None) -> str | None:
    return value if value and value not in ("Unknown", "None", "N/A") else None


def iso_time(slurm_time: str | None) -> str | None:
    """Slurm's local `YYYY-MM-DDTHH:MM:SS` as ISO-8601 with this machine's UTC offset."""
    if not slurm_time:
        return None
    try:
        return datetime.fromisoformat(slurm_time).astimezone(UTC).isoformat()
    except ValueError:
        return None


def _duration_seconds(value: str | None) -> float:
    """`[days-]hours:minutes:seconds` (or `minutes:seconds`) as seconds; 0 when unreadable."""
    if not value:
        return 0.0
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not (days.isdigit() or days == ""):
        return 0.0
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(seconds + (int(days) * 86400 if days else 0))


def job_info(text: str) -> JobInfo:
    """A `JobInfo` from `scontrol show -o job` text."""
    values = parse_key_values(text.strip().splitlines()[0] if text.strip() else "")
    code, sig = parse_exit_code(values.get("ExitCode"))
    state = values.get("JobState", "").split(" ")[0]
    return JobInfo(
        job_id=values.get("JobId", ""), state=state, reason=values.get("Reason", ""), exit_code=code, signal=sig,
        node_list=values.get("NodeList", "") if values.get("NodeList") != "(null)" else "",
        start_time=_slurm_time(values.get("StartTime")), end_time=_slurm_time(values.get("EndTime")),
        run_seconds=_duration_seconds(values.get("RunTime")), fields=values, text=text,
    )


class SlurmClient:
    """Slurm's commands as methods. Every failure is translated into `SlurmError`'s tree.

    Args:
        runner: Runs one command (argv, environment, timeout) and returns its `CommandResult`.
        env: The environment of every command (e.g. with `SLURM_CONF`); None = this process's.
        timeout_seconds: Limit for one command.
    """

    def __init__(
        self, *, runner: Runner = run_command, env: Mapping[str, str] | None = None, timeout_seconds: float = 30.0
    ) -> None:
        self._runner = runner
        self._env = dict(env) if env is not None else None
        self._timeout = timeout_seconds

    @property
    def env(self) -> dict[str, str] | None:
        return dict(self._env) if self._env is not None else None

    def _run(self, *argv: str, env: Mapping[str, str] | None = None, rejected: bool = False) -> str:
        result = self._runner(argv, env if env is not None else self._env, self._timeout)
        if result.returncode == 0:
            return result.stdout
        said = " ".join((result.stderr or result.stdout).split())[:500] or f"exit status {result.returncode}"
        message = f"{argv[0]} {argv[1] if len(argv) > 1 else ''}: {said}".replace("  ", " ")
        if _UNAVAILABLE.search(said):
            raise SlurmUnavailable(message)
        if _NOT_FOUND.search(said):
            raise JobNotFound(message)
        raise (SlurmRejected if rejected else SlurmError)(message)

    def submit(self, script: str, options: Sequence[str], env: Mapping[str, str]) -> str:
        """`sbatch --parsable OPTIONS SCRIPT` with `env` as the job's environment; returns the job id."""
        out = self._run("sbatch", "--parsable", *options, script, env=env, rejected=True)
        job_id = out.strip().splitlines()[-1].split(";")[0] if out.strip() else ""
        if not job_id.isdigit():
            raise SlurmError(f"sbatch: expected a job id, got {out.strip()[:200]!r}")
        return job_id

    def queued(self) -> list[QueuedJob]:
        """This user's queued or running jobs, in one `squeue` (its default states: not ended ones)."""
        out = self._run("squeue", "--noheader", "--me", "--format=%i|%T|%j|%k")
        found = []
        for line in out.splitlines():
            job_id, _, rest = line.partition("|")
            state, _, rest = rest.partition("|")
            name, _, comment = rest.partition("|")  # the comment last: a job's own may hold a '|'
            if job_id.strip().isdigit():
                found.append(QueuedJob(job_id.strip(), state.strip(), name.strip(), comment.strip()))
        return found

    def state(self, job_id: str) -> str | None:
        """The job's state as squeue sees it; None once squeue no longer lists it."""
        found = self.status(job_id)
        return found[0] if found else None

    def status(self, job_id: str) -> tuple[str, str] | None:
        """The job's state and squeue's reason for it (why a pending job waits: `Resources`, `Priority`,
        `BeginTime`, `ReqNodeNotAvail, ...`; `None` when there is none); None once squeue no longer lists it."""
        try:
            out = self._run("squeue", "--noheader", f"--jobs={job_id}", "--states=all", "--format=%T|%r")
        except JobNotFound:
            return None
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if not lines:
            return None
        state, _, reason = lines[0].partition("|")
        return state.strip(), reason.strip()

    def show_job(self, job_id: str) -> JobInfo:
        """`scontrol show -o job ID`, parsed; raises `JobNotFound` once the record aged out."""
        text = self._run("scontrol", "--oneliner", "show", "job", job_id)
        if not text.strip():
            raise JobNotFound(f"scontrol show job {job_id}: no record")
        return job_info(text)

    def show_job_text(self, job_id: str) -> str:
        """`scontrol show job ID` as people read it."""
        return self._run("scontrol", "show", "job", job_id)

    def batch_script(self, job_id: str) -> str:
        """The batch script Slurm holds for the job (`scontrol write batch_script ID -`)."""
        return self._run("scontrol", "write", "batch_script", job_id, "-")

    def show_node(self, node: str) -> str:
        """`scontrol show node NODE`: its state and reason."""
        return self._run("scontrol", "show", "node", node)

    def accounting(self, job_id: str) -> str:
        """`sacct --parsable2` for the job and each of its steps: one `|`-separated row each, with a header.

        The columns are `ACCOUNTING_FIELDS`; `accounting_rows` reads them. Raises `SlurmError` where
        the cluster keeps no accounting ("accounting storage is disabled").
        """
        return self._run("sacct", "--parsable2", f"--jobs={job_id}",
                         f"--format={','.join(ACCOUNTING_FIELDS)}")

    def accounting_json(self, job_id: str) -> str:
        """`sacct --json` for the job: every field Slurm keeps, steps included (Slurm 21.08 and later)."""
        return self._run("sacct", "--json", f"--jobs={job_id}")

    def ping(self) -> str:
        """`scontrol ping`: which controller the configuration names and whether it answers (one line)."""
        try:
            text = self._run("scontrol", "ping")
        except SlurmError as exc:
            text = str(exc)
        return " ".join(text.split("*")[0].split())

    def config(self) -> dict[str, str]:
        """`scontrol show config` as a dict (keys like JobCompLoc, MinJobAge)."""
        out = self._run("scontrol", "show", "config")
        values = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        return values

    def nodes(self, partition: str | None) -> list[tuple[str, str]]:
        """(node, state) of every node in `partition` (the default one when None)."""
        if partition is None:  # sinfo alone lists every partition's nodes; sbatch alone uses the default one's
            listed = self._run("sinfo", "--noheader", "--format=%P").split()
            partition = next((p.rstrip("*") for p in listed if p.endswith("*")), None)
        argv = ["sinfo", "--noheader", "--Node", "--format=%N|%T"]
        out = self._run(*argv, *([f"--partition={partition}"] if partition else []))
        pairs = (line.partition("|") for line in out.splitlines() if "|" in line)
        return sorted({(node.strip(), state.strip()) for node, _, state in pairs})

    def hostnames(self, node_list: str) -> list[str]:
        """A node list such as `gpu[01-03]` as names (`scontrol show hostnames`)."""
        return [line.strip() for line in self._run("scontrol", "show", "hostnames", node_list).splitlines() if line.strip()]

    def cancel(self, job_id: str, signal_name: str | None = None) -> None:
        """`scancel [--signal=SIG] ID`; a job Slurm has already forgotten is not an error."""
        try:
            self._run("scancel", *([f"--signal={signal_name}", "--full"] if signal_name else []), job_id)
        except JobNotFound:
            pass
