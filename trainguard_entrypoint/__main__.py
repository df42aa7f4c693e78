"""``python -m trainguard_entrypoint``: parse the options, then snapshot, run, post-mortem, report.

Options can come from the command line or, so a Kubernetes manifest can set them, from
``TRAINGUARD_*`` environment variables. Only the order of the steps and their error handling live
here; each step is in its own module. Whatever fails around the command is recorded in the crash
report's ``problems`` and never changes the exit status, which is the command's (128+N for signal N).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

from trainguard_entrypoint import ORIGINAL_PYTHONPATH, paths
from trainguard_entrypoint.checkpoints import list_checkpoints
from trainguard_entrypoint.coredumps import (CorePolicy, collect_child_cores, collect_core_files, enable_core_dumps,
                                             signal_name)
from trainguard_entrypoint.files import utc_now_iso, write_json_atomic
from trainguard_entrypoint.report import AttemptFacts, build_crash_report, write_crash_report
from trainguard_entrypoint.snapshot import host_facts, snapshot_environment, snapshot_gpu
from trainguard_entrypoint.supervision import SupervisorWatch, become_subreaper, end_descendants
from trainguard_entrypoint.forensics import Forensics
from trainguard_entrypoint.notice import NOTICE_FILE_ENV, NOTICE_GRACE_ENV, Notice, current_notice, grace_seconds, write_notice
from trainguard_entrypoint.tee import STOP_SIGNALS, ChildResult, SignalForwarder, run_command
from trainguard_entrypoint.slurmnotice import task_notice
from trainguard_entrypoint.termination import write_summary
from trainguard_entrypoint.trainpath import with_helper

PROG = "trainguard-entrypoint"
# A pod of a multi-node attempt other than the first keeps its files in `tasks/<index>` of the
# attempt's folder (as a Slurm task does), so no two nodes write one log or one error file.
NODE_INDEX = "TRAINGUARD_NODE_INDEX"
_TORCHRUN_PLACES = (("PET_LOG_DIR", paths.RANKS),
                    ("TORCHELASTIC_ERROR_FILE", f"{paths.TORCHELASTIC}/{paths.TORCHELASTIC_ERROR}"))
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
T = TypeVar("T")


class UsageError(Exception):
    """An option is missing or malformed; the message names it and the fix."""


@dataclass(frozen=True)
class Options:
    """The entrypoint's parsed options."""

    workspace: Path
    run_id: str
    attempt: int
    checkpoint_dir: Path | None
    log_file: Path
    workdir: Path | None
    gpu_timeout_seconds: float
    command: tuple[str, ...]
    grace_seconds: float = 10.0
    termination_log: Path | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints usage plus the error over two lines; ours is one line with the fix
        raise UsageError(f"{message}; usage: {self.usage}")


def _parser() -> argparse.ArgumentParser:
    usage = f"{PROG} --workspace DIR --run-id R --attempt N [--checkpoint-dir D] [--log-file F] -- COMMAND [ARGS...]"
    parser = _Parser(prog=PROG, usage=usage, add_help=False)
    parser.add_argument("--workspace", help="attempt folder (env TRAINGUARD_WORKSPACE)")
    parser.add_argument("--run-id", help="run id (env TRAINGUARD_RUN_ID)")
    parser.add_argument("--attempt", help="attempt number from 1 (env TRAINGUARD_ATTEMPT)")
    parser.add_argument("--checkpoint-dir", help="checkpoint folder (env TRAINGUARD_CHECKPOINT_DIR)")
    parser.add_argument("--log-file", help="log file (default WORKSPACE/logs/train-R-attempt-N.log)")
    parser.add_argument("--workdir", help="the command's working directory (env TRAINGUARD_WORKDIR; default: ours)")
    parser.add_argument(
        "--grace-seconds", help="SIGTERM-to-SIGKILL time when stopping (env TRAINGUARD_GRACE_SECONDS, default 10)"
    )
    parser.add_argument(
        "--gpu-timeout-seconds", help="limit per nvidia-smi call (env TRAINGUARD_GPU_TIMEOUT_SECONDS, default 20)"
    )
    parser.add_argument(
        "--termination-log", help="write a short JSON crash summary here (env TRAINGUARD_TERMINATION_LOG)"
    )
    return parser


def _pick(value: str | None, environ: Mapping[str, str], name: str) -> str | None:
    return value if value not in (None, "") else (environ.get(name) or None)


def parse_options(argv: Sequence[str], environ: Mapping[str, str]) -> Options:
    """Parse ``argv`` (without the program name), falling back to ``TRAINGUARD_*`` variables.

    Raises:
        UsageError: One line naming the missing or malformed option and how to fix it.
    """
    if "--" not in argv:
        raise UsageError("no command: put the training command after '--', e.g. -- python train.py")
    split = list(argv).index("--")
    command = tuple(argv[split + 1 :])
    if not command:
        raise UsageError("no command after '--': give the training command, e.g. -- python train.py")
    args = _parser().parse_args(list(argv[:split]))
    workspace = _pick(args.workspace, environ, "TRAINGUARD_WORKSPACE")
    run_id = _pick(args.run_id, environ, "TRAINGUARD_RUN_ID")
    attempt_text = _pick(args.attempt, environ, "TRAINGUARD_ATTEMPT")
    if workspace is None:
        raise UsageError("--workspace is required (or set TRAINGUARD_WORKSPACE): the attempt folder")
    if run_id is None or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise UsageError(
            f"--run-id {run_id!r} is missing or not a safe name (or set TRAINGUARD_RUN_ID): "
            "use letters, digits, '.', '_' or '-'"
        )
    if attempt_text is None or not attempt_text.isdigit() or int(attempt_text) < 1:
        raise UsageError(
            f"--attempt {attempt_text!r} is missing or invalid (or set TRAINGUARD_ATTEMPT): give a whole number from 1"
        )
    gpu_timeout = _seconds(args.gpu_timeout_seconds, environ, "gpu-timeout-seconds", "20")
    grace = _seconds(args.grace_seconds, environ, "grace-seconds", "10")
    attempt = int(attempt_text)
    checkpoint_dir = _pick(args.checkpoint_dir, environ, "TRAINGUARD_CHECKPOINT_DIR")
    root = node_folder(Path(workspace).absolute(), environ)
    default_log = paths.AttemptPaths(root).log(run_id, attempt)
    log_file = Path(args.log_file).absolute() if args.log_file else default_log
    workdir = _pick(args.workdir, environ, "TRAINGUARD_WORKDIR")
    termination_log = _pick(args.termination_log, environ, "TRAINGUARD_TERMINATION_LOG")
    return Options(root, run_id, attempt, Path(checkpoint_dir).absolute() if checkpoint_dir else None,
                   log_file, Path(workdir).absolute() if workdir else None, gpu_timeout, command, grace,
                   Path(termination_log) if termination_log else None)


def _seconds(value: str | None, environ: Mapping[str, str], option: str, default: str) -> float:
    env_name = "TRAINGUARD_" + option.upper().replace("-", "_")
    text = _pick(value, environ, env_name) or default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise UsageError(f"--{option} {text!r} is not a number of seconds (or set {env_name}): give e.g. {default}")
    return seconds


def node_index(environ: Mapping[str, str]) -> str:
    """This node's rank: `TRAINGUARD_NODE_INDEX`, or the variable `TRAINGUARD_NODE_INDEX_FROM` names (a
    PyTorchJob's operator sets `PET_NODE_RANK` itself); "" when the attempt has one node."""
    index = environ.get(NODE_INDEX) or environ.get(environ.get(NODE_INDEX + "_FROM") or "", "")
    return index if index.isdigit() else ""


def node_folder(workspace: Path, environ: Mapping[str, str]) -> Path:
    """The folder this node's files go to: the attempt's own for node 0, else `tasks/<index>` in it."""
    index = node_index(environ)
    return paths.AttemptPaths(workspace).node(int(index)).folder if index else workspace


def child_environment(options: Options, environ: Mapping[str, str]) -> dict[str, str]:
    """What the command sees: our environment plus where the attempt lives, output unbuffered.

    On a node other than the first, torchrun's rank logs and error file follow the node's folder
    where they were trainguard's defaults in the attempt's folder.
    """
    env = dict(environ)
    if node_index(environ) and not env.get("NODE_RANK"):
        env["NODE_RANK"] = node_index(environ)  # for launchers other than torchrun, as on the other kinds
    base = environ.get("TRAINGUARD_WORKSPACE")
    if base and Path(base).absolute() != options.workspace:
        for name, place in _TORCHRUN_PLACES:
            if env.get(name) == f"{base.rstrip('/')}/{place}":
                env[name] = str(options.workspace / place)
    # A launcher that had to put trainguard on PYTHONPATH to start us leaves the command's own here.
    if ORIGINAL_PYTHONPATH in env:
        original = env.pop(ORIGINAL_PYTHONPATH)
        if original:
            env["PYTHONPATH"] = original
        else:
            env.pop("PYTHONPATH", None)
    env.update(
        TRAINGUARD_RUN_ID=options.run_id,
        TRAINGUARD_ATTEMPT=str(options.attempt),
        TRAINGUARD_WORKSPACE=str(options.workspace),
        PYTHONUNBUFFERED="1",  # progress must reach the log while it happens, not at exit
    )
    if options.checkpoint_dir is not None:
        env["TRAINGUARD_CHECKPOINT_DIR"] = str(options.checkpoint_dir)
    # Where a stop with warning is announced; a backend that gives notice itself may have named it.
    env.setdefault(NOTICE_FILE_ENV, str(paths.AttemptPaths(options.workspace).notice))
    env.setdefault(NOTICE_GRACE_ENV, f"{options.grace_seconds:g}")
    return env


def notice_giver(env: Mapping[str, str], not_before: float) -> Callable[[int, float], None]:
    """What the entrypoint does on the first SIGTERM/SIGINT/SIGHUP while the command runs, before passing
    it on (after the ranks' stacks are taken): unless whoever stops us already gave notice for this
    attempt, write the notice file, given when the signal came, with a deadline the grace from now
    (the time the command gets before SIGKILL); in a Slurm job that Slurm is preempting, the
    preemption's notice with the job's new end as its deadline (`slurmnotice.task_notice`)."""
    def give(signum: int, received_at: float) -> None:
        if current_notice(env, not_before=not_before) is not None:
            return
        slurm = task_notice(env, received_at) if signum == signal.SIGTERM else None
        if slurm is not None:  # a Slurm preemption, which signals the tasks and not the batch shell
            write_notice(env[NOTICE_FILE_ENV], slurm)
            return
        grace = grace_seconds(env)
        reason = "interrupted" if signum == signal.SIGINT else "terminated"
        notice = Notice(reason, received_at, time.time() + grace,
                        f"{signal_name(signum)} to the entrypoint, grace {grace:g}s")
        write_notice(env[NOTICE_FILE_ENV], notice)
    return give


def _guard(problems: list[str], step: str, action: Callable[[], T]) -> T | None:
    try:
        return action()
    except Exception as exc:  # a failed snapshot step is evidence, not a reason to stop
        problems.append(f"{step}: {type(exc).__name__}: {exc}")
        return None


def _before(options: Options, env: Mapping[str, str], problems: list[str]) -> CorePolicy | None:
    snap = options.workspace / paths.SNAPSHOT
    folders = [options.workspace / paths.LOGS, options.workspace / paths.COREDUMPS, snap]
    for made_elsewhere in ("TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        if env.get(made_elsewhere):  # PyTorch writes these but makes no folder for them
            folders.append(Path(env[made_elsewhere]).parent)
    for folder in folders:
        _guard(problems, f"create {folder}", lambda: folder.mkdir(parents=True, exist_ok=True))
    policy = _guard(problems, "enable core dumps", enable_core_dumps)
    _guard(problems, f"{paths.SNAPSHOT}/{paths.ENV_SNAPSHOT}", lambda: snapshot_environment(snap / paths.ENV_SNAPSHOT, env))
    host = _guard(problems, "host facts", host_facts) or {}
    if policy is not None:
        host["core_dumps"] = {"kept": policy.disabled_reason is None, "reason": policy.disabled_reason}
    _guard(problems, f"{paths.SNAPSHOT}/{paths.HOST_SNAPSHOT}", lambda: write_json_atomic(snap / paths.HOST_SNAPSHOT, host))
    _guard(problems, f"{paths.SNAPSHOT}/{paths.GPU_BEFORE}",
           lambda: snapshot_gpu(snap / paths.GPU_BEFORE, env, timeout_seconds=options.gpu_timeout_seconds))
    return policy


def _run(
    options: Options, env: Mapping[str, str], forwarder: SignalForwarder, supervisor: SupervisorWatch, subreaper: bool
) -> ChildResult:
    stops = [s for s in forwarder.received if s in STOP_SIGNALS]
    if stops:
        first = stops[0]
        why = f"received {signal_name(first)} before the command started; not started"
        return ChildResult(None, 128 + first, first, False, why)
    return run_command(
        options.command, env=env, log_path=options.log_file, forwarder=forwarder, cwd=options.workdir,
        supervisor=supervisor, grace_seconds=options.grace_seconds, reap_orphans=subreaper,
    )


def _end_descendants(options: Options, problems: list[str]) -> list[dict[str, object]]:
    """End whatever the command left running (a subreaper sees even ``setsid`` escapees)."""
    ended = end_descendants(options.grace_seconds)
    if ended:
        names = ", ".join(f"{d.pid} ({d.command[:60]})" for d in ended[:5])
        problems.append(f"{len(ended)} process(es) outlived the command and were ended: {names}")
    return [{"pid": d.pid, "command": d.command} for d in ended]


def _cores(
    policy: CorePolicy | None, result: ChildResult, options: Options, not_before: float
) -> tuple[list[str], str | None]:
    if result.pid is None:
        return [], f"the command never started ({result.start_error})"
    if policy is None:
        return [], "core dump settings could not be read (see problems)"
    cwd, dest = options.workdir or Path.cwd(), options.workspace / paths.COREDUMPS
    own, reason = collect_core_files(
        policy, pid=result.pid, cwd=cwd, signal_number=result.signal, exit_code=result.exit_code,
        core_dumped=result.core_dumped, dest=dest, not_before=not_before,
    )
    # a launcher's workers (torchrun's ranks) crash with a core while the launcher exits with a code
    children, problems = collect_child_cores(policy, parents=frozenset({result.pid, os.getpid()}),
                                             command_pid=result.pid, cwd=cwd, dest=dest, not_before=not_before)
    if children and not own:
        reason = None
    return own + children, "; ".join(filter(None, [reason, *problems])) or None


def run_attempt(options: Options, environ: Mapping[str, str], forwarder: SignalForwarder) -> int:
    """Snapshot, run the command, keep cores, write the crash report, snapshot the GPU again."""
    problems: list[str] = []
    supervisor = SupervisorWatch.start()  # before the snapshots, so a supervisor lost during them is noticed
    env = child_environment(options, environ)
    subreaper_problem = become_subreaper()
    if subreaper_problem:
        problems.append(subreaper_problem)
    forensics = Forensics.for_attempt(options.workspace, options.log_file, env, _say)
    _guard(problems, "training helper on PYTHONPATH", lambda: env.update(with_helper(env, options.workspace)))
    policy = _before(options, env, problems)
    started_at, started_wall, started = utc_now_iso(), time.time(), time.monotonic()
    forwarder.give_notice = notice_giver(env, started_wall)
    forwarder.before_stop = forensics.before_stop
    forensics.start(lambda: forwarder.child_pid)
    try:
        result = _run(options, env, forwarder, supervisor, subreaper_problem is None)
    finally:
        forensics.stop()
    descendants = _guard(problems, "end descendants", lambda: _end_descendants(options, problems)) or []
    facts = AttemptFacts(options.run_id, options.attempt, options.command, started_at, utc_now_iso(),
                         time.monotonic() - started, options.log_file)
    kept = _guard(problems, "core dumps", lambda: _cores(policy, result, options, started_wall))
    cores, core_reason = kept or ([], "collecting core files failed (see problems)")
    checkpoints = None
    if (checkpoint_dir := options.checkpoint_dir) is not None:
        checkpoints = _guard(problems, "checkpoint listing", lambda: list_checkpoints(checkpoint_dir))
    report_path = options.workspace / paths.CRASH_REPORT
    report = _guard(problems, "crash report", lambda: build_crash_report(
        facts, result, core_files=cores, core_absent_reason=core_reason, checkpoints=checkpoints,
        received_signals=forwarder.received, problems=problems, descendants_ended=descendants, environ=env,
    ))
    if report is not None:
        _guard(problems, "crash report", lambda: write_crash_report(report_path, report))
        if (termination_log := options.termination_log) is not None:
            _guard(problems, "termination message", lambda: write_summary(termination_log, report, report_path))
    after = options.workspace / paths.SNAPSHOT / paths.GPU_AFTER
    timeout = options.gpu_timeout_seconds
    _guard(problems, f"{paths.SNAPSHOT}/{paths.GPU_AFTER}", lambda: snapshot_gpu(after, env, timeout_seconds=timeout))
    for problem in problems:
        _say(f"warning: {problem}")
    _say(f"command ended: {_describe(result)}; crash report: {report_path}")
    return result.exit_code


def _describe(result: ChildResult) -> str:
    if result.start_error:
        return f"exit code {result.exit_code} ({result.start_error})"
    if result.supervisor_lost:
        return f"exit code {result.exit_code} ({result.supervisor_lost})"
    if result.signal is not None:
        core = ", core dumped" if result.core_dumped else ""
        return f"exit code {result.exit_code} (killed by {signal_name(result.signal)}{core})"
    return f"exit code {result.exit_code}"


def _say(message: str) -> None:
    try:
        print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # a closed stderr must not change the exit status


def _too_early(signum: int, frame: object) -> None:
    _say("the ranks' stacks were asked for before the command started: there are none yet; ask again once it runs")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the entrypoint; return the command's exit status (2 for a usage error)."""
    environ = dict(os.environ if environ is None else environ)
    forwarder = SignalForwarder()
    forwarder.install()  # early, so a SIGTERM during the snapshots is not lost
    # SIGQUIT (`trainguard dump`) ends a process by default: until the watch takes it over, one that
    # comes too early is said and dropped. A handler, unlike SIG_IGN, is not passed on to the command.
    signal.signal(signal.SIGQUIT, _too_early)
    try:
        try:
            options = parse_options(sys.argv[1:] if argv is None else argv, environ)
        except UsageError as exc:
            _say(f"error: {exc}")
            return 2
        return run_attempt(options, environ, forwarder)
    finally:
        forwarder.restore()


if __name__ == "__main__":
    sys.exit(main())
