"""GPU-hours wasted by five retry policies, replayed over one trace of failing training runs.

The trace
    Failure categories, their frequencies and the failure rate come from Meta's published
    characterization of the 54-day, 16,384-GPU Llama 3 405B pre-training run: 419 unexpected
    interruptions, broken down by root cause in Table 5 of "The Llama 3 Herd of Models"
    (Dubey et al., Meta, arXiv:2407.21783, July 2024, section 3.3.4). That gives a failure rate of
    419 / (16,384 GPUs x 54 days x 24 h) = 1.97e-5 per GPU-hour, and time to failure is drawn
    from the exponential distribution with that rate scaled to the run's GPU count (the paper
    reports interruptions as a steady rate over the run). Each root cause is mapped to its
    taxonomy category (``MEAN_SHARE`` below says how); a failed attempt carries a real log
    excerpt of that category, drawn from the test corpus (tests/triage/corpus, every row taken
    from a public issue), with its exit code where the excerpt has one, else the exit code the
    mechanism produces (``EXIT_CODE``).

    Each run is a job of ``--job-hours`` of training on ``--gpus`` GPUs that writes a checkpoint
    every ``--checkpoint-hours``. A failure whose cause stays (a software bug, a broken
    dependency) happens again at the same training step on every later attempt until a person
    fixes it; any other failure is drawn afresh for the next attempt. The same draws are replayed
    under every policy, in order.

The policies
    retry-all        a Kubernetes Job with backoffLimit 3: up to 4 attempts, each from scratch.
    kubeflow-exit    Kubeflow's restartPolicy ExitCode: exit codes 1-127 are permanent, 128-255
                     are restarted (backoffLimit 3); a restarted worker resumes from the newest
                     checkpoint.
    torchelastic     torchrun --max-restarts=3: any failure restarts the workers, which resume
                     from the newest checkpoint.
    no-retry         every failure goes to a person.
    trainguard       the real classifier on each attempt's excerpt, then the real retry policy
                     (trainguard.core.policy.decide_retry) with max_attempts 4 like the others' budget;
                     but trainguard's budget counts attempts in a row without checkpoint progress, so
                     an attempt that saved a checkpoint refills it and only a failure that stays (a
                     non-retryable category), a breaker or four attempts stuck in a row stop a run.

For each policy: GPU-hours spent on attempts that could not succeed (started while a cause that
stays was present), GPU-hours of progress lost (work since the last checkpoint, or all of it when
restarting from scratch), runs finished without a person, runs that needed one, and the effective
training time: the share of all GPU-hours spent on attempts that is training the runs keep (all of
a finished run's, a handed-over run's up to its newest checkpoint).

    .venv/bin/python benchmarks/gpu_hours_wasted.py
    .venv/bin/python benchmarks/gpu_hours_wasted.py --runs 400 --gpus 2048 --job-hours 72

On that replay (2026-12-03, the corpus with its fresh blind set, triage reading a batch script
missing from slurmd's spool as the node's failure): trainguard finishes 274 runs without a person and
hands 126 to one, every one of them at a software bug or a broken dependency (120 code_error, 6
config_error); none for a spent budget. With a budget of attempts in all (max_total_attempts 4) it
finished 205 and handed over 195, 68 of them when hardware or platform faults had spent the budget.
It wastes 981,057 GPU-hours, 91.5 % fewer than retry-all (11,559,363) and 33 % fewer than
torchelastic (1,464,106), but more than no-retry (383,732) and Kubeflow's ExitCode (485,960): those
stop at the first failure, so they lose the progress of one failure per run and leave the rest of
the run (22 and 37 finished) to a person, whose own restarts meet the same failures but are not
counted here. Per GPU-hour spent, the waste is the same (an effective training time of 0.980 against
0.981). benchmarks/goodput.py carries every run to its end, the person's restarts and wait included,
and there trainguard wastes less than every other policy.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainguard.core import policy as retry_policy  # noqa: E402
from trainguard.core import triage  # noqa: E402
from trainguard.core.taxonomy import Category  # noqa: E402
from trainguard.core.triage.decide import Gathered, conclude, gather  # noqa: E402

# Llama 3 405B pre-training, Table 5: unexpected interruptions by root cause, and the taxonomy
# category each becomes. Host maintenance takes the node away (preempted); broken host parts
# (SSD, PSU, chassis, CPU, RAM, IO board) lose the node; silent data corruption is a faulty GPU.
LLAMA3_INTERRUPTIONS: dict[str, tuple[int, Category]] = {
    "Faulty GPU": (148, Category.GPU_FAULT),
    "GPU HBM3 Memory": (72, Category.GPU_FAULT),
    "Software Bug": (54, Category.CODE_ERROR),
    "Network Switch/Cable": (35, Category.NCCL_ERROR),
    "Host Maintenance": (32, Category.PREEMPTED),
    "GPU SRAM Memory": (19, Category.GPU_FAULT),
    "GPU System Processor": (17, Category.GPU_FAULT),
    "NIC": (7, Category.NCCL_ERROR),
    "NCCL Watchdog Timeouts": (7, Category.NCCL_ERROR),
    "Silent Data Corruption": (6, Category.GPU_FAULT),
    "GPU Thermal Interface + Sensor": (6, Category.GPU_FAULT),
    "SSD": (3, Category.NODE_FAILURE),
    "Power Supply": (3, Category.NODE_FAILURE),
    "Server Chassis": (2, Category.NODE_FAILURE),
    "IO Expansion Board": (2, Category.NODE_FAILURE),
    "Dependency": (2, Category.CONFIG_ERROR),
    "CPU": (2, Category.NODE_FAILURE),
    "System Memory": (2, Category.NODE_FAILURE),
}
LLAMA3_GPUS, LLAMA3_DAYS = 16_384, 54
FAILURES_PER_GPU_HOUR = sum(n for n, _ in LLAMA3_INTERRUPTIONS.values()) / (
    LLAMA3_GPUS * LLAMA3_DAYS * 24)
# Causes that stay: the next attempt meets them again at the same step until a person acts.
PERSISTENT = frozenset({Category.CODE_ERROR, Category.CONFIG_ERROR, Category.DATA_ERROR,
                        Category.CUDA_OOM, Category.HOST_OOM, Category.DIVERGENCE,
                        Category.SHM_EXHAUSTED})
# The exit code each mechanism produces when the excerpt does not say: a Python exception exits 1
# (CUDA and ECC errors surface as RuntimeError), the NCCL watchdog aborts (SIGABRT, 134), a
# preempted pod gets SIGTERM (143), a lost node's pod is killed (137).
EXIT_CODE = {Category.NCCL_ERROR: 134, Category.PREEMPTED: 143, Category.NODE_FAILURE: 137}
CORPUS = REPO / "tests" / "triage" / "corpus"
BUDGET = 4  # attempts: Job backoffLimit 3, torchrun --max-restarts=3, trainguard max_attempts=4


@dataclass(frozen=True)
class Failure:
    """One draw of the trace: when the attempt fails (training hours in) and with what."""

    after_hours: float
    category: Category
    excerpt: dict[str, object]
    cause: str = ""  # the trace's root cause, e.g. "Faulty GPU"


@dataclass
class Outcome:
    """What one policy made of one run."""

    doomed_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    spent_gpu_hours: float = 0.0  # every attempt's GPU-hours, doomed or not
    kept_gpu_hours: float = 0.0  # training the run keeps: all of it when it finished, else its checkpoint
    attempts: int = 0
    finished: bool = False


@dataclass
class Run:
    """The state of one run while a policy replays it."""

    draws: list[Failure]
    job_hours: float
    checkpoint_hours: float
    progress: float = 0.0  # training hours done and kept in the newest checkpoint
    persistent_at: float | None = None  # progress at which a cause that stays fires
    persistent: Failure | None = None
    history: list[retry_policy.AttemptRecord] = field(default_factory=list)
    previous: list[triage.Diagnosis] = field(default_factory=list)


def load_excerpts() -> dict[Category, list[dict[str, object]]]:
    """Every corpus row by its labelled category."""
    by_category: dict[Category, list[dict[str, object]]] = {}
    for path in sorted(CORPUS.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                by_category.setdefault(Category(row["category"]), []).append(row)
    return by_category


def draw(rng: random.Random, rate: float, excerpts: dict[Category, list[dict[str, object]]],
         mix: dict[str, tuple[int, Category]] | None = None) -> Failure:
    """One failure: its time from the attempt's start, its cause's category and an excerpt of it.

    `mix` maps each root cause to its count and category (the Llama 3 table when None).
    """
    causes = list((mix or LLAMA3_INTERRUPTIONS).items())
    cause, (_, category) = rng.choices(causes, [n for _, (n, _) in causes])[0]
    return Failure(rng.expovariate(rate), category, rng.choice(excerpts[category]), cause)


def make_trace(args: argparse.Namespace) -> list[list[Failure]]:
    """Per run, the failure draws its attempts meet in order.

    Twelve per run cover every policy with a budget of attempts in all; a run that outlasts them
    (trainguard keeps retrying while checkpoints move) meets more, drawn for it alone (`more_draws`),
    so the first twelve, and every other policy's figures, do not depend on how many it needs.
    """
    rng = random.Random(args.seed)
    excerpts = load_excerpts()
    rate = FAILURES_PER_GPU_HOUR * args.gpus
    trace = []
    for index in range(args.runs):
        draws = [draw(rng, rate, excerpts) for _ in range(12)]
        trace.append(draws + more_draws(args, index, excerpts, draws))
    return trace


def more_draws(args: argparse.Namespace, index: int, excerpts: dict[Category, list[dict[str, object]]],
               first: list[Failure]) -> list[Failure]:
    """Draws beyond the first twelve, from the run's own generator, until they cover any run.

    A run that retries without bound fails at most `BUDGET` times in a row without a new checkpoint,
    so as many draws as the job has checkpoints, times that, always suffice.
    """
    rng = random.Random(f"{args.seed}-{index}")
    rate = FAILURES_PER_GPU_HOUR * args.gpus
    needed = (int(args.job_hours / args.checkpoint_hours) + 1) * BUDGET
    return [draw(rng, rate, excerpts) for _ in range(max(needed - len(first), 0))]


def attempt(run: Run, out: Outcome, gpus: int, resume: bool) -> Failure | None:
    """Play one attempt; return its failure, or None when the job finished."""
    start = run.progress if resume else 0.0
    doomed = run.persistent_at is not None
    if run.persistent is not None and run.persistent_at is not None:
        failure: Failure | None = run.persistent
        ends = run.persistent_at
    else:
        failure = run.draws.pop(0)
        ends = start + failure.after_hours
    if failure is not None and ends >= run.job_hours:
        failure, ends = None, run.job_hours
    out.attempts += 1
    out.spent_gpu_hours += (ends - start) * gpus
    if doomed:
        out.doomed_gpu_hours += (ends - start) * gpus
    if failure is None:
        return None
    checkpointed = start + int((ends - start) / run.checkpoint_hours) * run.checkpoint_hours
    run.progress = max(checkpointed, run.progress if resume else 0.0)
    out.lost_gpu_hours += (ends - run.progress) * gpus
    if failure.category in PERSISTENT and run.persistent is None:
        run.persistent, run.persistent_at = failure, ends
    return failure


def exit_code(failure: Failure) -> int:
    code = failure.excerpt.get("exit_code")
    return code if isinstance(code, int) else EXIT_CODE.get(failure.category, 1)


Decider = Callable[[Run, Failure, int], bool]  # (run, failure, attempt number) -> retry?


def replay(draws: list[Failure], args: argparse.Namespace, decide: Decider,
           resume: bool) -> Outcome:
    """One run under one policy: attempts until it finishes or the policy hands it over."""
    run = Run(list(draws), args.job_hours, args.checkpoint_hours)
    out = Outcome()
    number = 0
    while True:
        number += 1
        failure = attempt(run, out, args.gpus, resume)
        if failure is None:
            out.finished = True
            out.kept_gpu_hours = run.job_hours * args.gpus
            return out
        if not decide(run, failure, number):
            # A person resumes it by hand later: the loss since the checkpoint is already counted,
            # and an attempt restarting from scratch loses everything before it too.
            out.kept_gpu_hours = run.progress * args.gpus
            return out


def retry_all(run: Run, failure: Failure, number: int) -> bool:
    return number < BUDGET


def kubeflow_exit_code(run: Run, failure: Failure, number: int) -> bool:
    return number < BUDGET and 128 <= exit_code(failure) <= 255


def no_retry(run: Run, failure: Failure, number: int) -> bool:
    return False


def error_files(row: dict[str, object]) -> tuple[triage.ErrorFile, ...]:
    """The excerpt's torchelastic error files, as the batch CLI reads a record's (a row may have no log)."""
    found = []
    for item in row.get("error_files") or ():  # type: ignore[attr-defined]
        content = item if isinstance(item, str) else item.get("content") if isinstance(item, dict) else None
        parsed = triage.parse_error_file(content) if isinstance(content, str) else None
        if parsed is not None:
            found.append(parsed)
    return tuple(found)


# By the excerpt's identity; the entry holds the excerpt, so its id is never reused for another.
_GATHERED: dict[int, tuple[dict[str, object], triage.Signals, Gathered]] = {}


def diagnose(failure: Failure, previous: list[triage.Diagnosis]) -> triage.Diagnosis:
    """The real classifier on the excerpt, as the flow runs it (`judging.judge`: no stacks here).

    The flow judges each attempt on its own evidence, without the run's earlier diagnoses (the
    retry policy weighs the run's history), so neither does this; `previous` only records them.
    The rules' scan of an excerpt does not depend on the run, so it is done once per excerpt.
    """
    row = failure.excerpt
    if id(row) not in _GATHERED:
        events = row.get("events")
        signals = triage.Signals(
            exit_code=exit_code(failure), reason=row.get("reason") or None,  # type: ignore[arg-type]
            events=tuple(events) if isinstance(events, list) else (events or ()),  # type: ignore[arg-type]
            log=row.get("log"), error_files=error_files(row))  # type: ignore[arg-type]
        _GATHERED[id(row)] = row, signals, gather(signals, triage.load_rules(), "auto")
    _, signals, gathered = _GATHERED[id(row)]
    diagnosis = conclude(signals, triage.load_rules(), (), gathered)
    assert diagnosis is not None
    previous.append(diagnosis)
    return diagnosis


def trainguard(run: Run, failure: Failure, number: int) -> bool:
    """The real classifier on the excerpt, then the real retry policy."""
    diagnosis = diagnose(failure, run.previous)
    newest = f"step-{run.progress:.2f}" if run.progress else None
    resumed = run.history[-1].newest_checkpoint if run.history else None
    # The scheduler honours the decision's avoid_nodes, so each attempt lands on a fresh node.
    run.history.append(retry_policy.AttemptRecord(
        number, diagnosis.category, diagnosis.retryable, diagnosis.fingerprint,
        resumed_from=resumed, newest_checkpoint=newest, node=f"node-{number}"))
    policy = retry_policy.RetryPolicy(max_attempts=BUDGET)
    # The run's checkpoints as a listing of its folder shows them, newest first.
    saved = int(round(run.progress / run.checkpoint_hours))
    listing = [f"step-{n * run.checkpoint_hours:.2f}" for n in range(saved, 0, -1)]
    decision = retry_policy.decide_retry(policy, run.history, listing)
    return decision.retry


POLICIES: dict[str, tuple[Decider, bool]] = {
    "retry-all (Job backoffLimit 3, from scratch)": (retry_all, False),
    "Kubeflow restartPolicy ExitCode": (kubeflow_exit_code, True),
    "torchelastic max_restarts=3 (from checkpoint)": (retry_all, True),
    "no retry": (no_retry, True),
    "trainguard": (trainguard, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--gpus", type=int, default=2048)
    parser.add_argument("--job-hours", type=float, default=72.0)
    parser.add_argument("--checkpoint-hours", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args()
    trace = make_trace(args)
    rows = {}
    for name, (decide, resume) in POLICIES.items():
        outcomes = [replay(draws, args, decide, resume) for draws in trace]
        rows[name] = {
            "attempts": sum(o.attempts for o in outcomes),
            "gpu_hours_on_attempts_that_could_not_succeed": round(
                sum(o.doomed_gpu_hours for o in outcomes)),
            "gpu_hours_of_progress_lost": round(sum(o.lost_gpu_hours for o in outcomes)),
            "runs_finished_without_a_person": sum(o.finished for o in outcomes),
            "runs_that_needed_a_person": sum(not o.finished for o in outcomes),
            # effective training time: the share of the GPU-hours spent that is training the runs keep
            "effective_training_time": round(
                sum(o.kept_gpu_hours for o in outcomes) / sum(o.spent_gpu_hours for o in outcomes), 3),
        }
    for row in rows.values():
        row["gpu_hours_wasted"] = (row["gpu_hours_on_attempts_that_could_not_succeed"]
                                   + row["gpu_hours_of_progress_lost"])
    baseline = rows["retry-all (Job backoffLimit 3, from scratch)"]["gpu_hours_wasted"]
    ours = rows["trainguard"]
    best_other = max(r["runs_finished_without_a_person"] for n, r in rows.items()
                     if n != "trainguard")
    print(json.dumps({
        "source": "Llama 3 405B pre-training interruptions (Dubey et al., Meta, 2024, Table 5)",
        "runs": args.runs, "gpus_per_run": args.gpus, "job_hours": args.job_hours,
        "checkpoint_hours": args.checkpoint_hours,
        "mean_hours_between_failures": round(1 / (FAILURES_PER_GPU_HOUR * args.gpus), 1),
        "attempts_in_trace": rows["retry-all (Job backoffLimit 3, from scratch)"]["attempts"],
        "policies": rows,
        "trainguard_waste_vs_retry_all": round(1 - ours["gpu_hours_wasted"] / baseline, 3),
        "trainguard_unattended_vs_best_other": ours["runs_finished_without_a_person"] - best_other,
    }, indent=2))


if __name__ == "__main__":
    main()
