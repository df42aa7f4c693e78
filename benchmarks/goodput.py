"""Effective training time per retry policy: where every hour of a long run goes, replayed.

The share of the time a run holds its GPUs that moves training forward ("effective training time",
as Meta reports "higher than 90 %" for Llama 3 405B: the time spent on useful training over the
elapsed time). Each run of `--job-hours` of training on `--gpus` GPUs is replayed until its training
is done, under each policy, with the same failure draws; a run a policy hands over waits for a
person, who removes a cause that stays (fixes the bug, drains the bad node) and resumes it from the
newest checkpoint under the same policy. So every policy finishes every run, and the elapsed time
adds up to 100 %:

    training that counts       the run's `--job-hours`, once
    progress lost              training done and thrown away: since the checkpoint resumed from
    restart                    detection, evidence, judgement, backoff, scheduling, initialisation
                               (NCCL and the framework), checkpoint load
    checkpoint saving          the blocking part of periodic saves; notice and just-in-time saves
    could not succeed          attempts (and their restarts) started while a cause that stays
                               was present: a bug, or a broken GPU the job restarted in place on
    waiting for a person       from a hand-over until a person resumes the run

GPU-hours wasted = the elapsed time minus the training that counts, times the GPUs (while a run
waits for a person its GPUs are held: the whole reservation idles, as in a dedicated run).

The traces (failure rate proportional to GPUs, as the sources report a steady rate):
    llama3     Llama 3 405B's 419 unexpected interruptions in 54 days on 16,384 GPUs (arXiv 2407.21783,
               Table 5), mapped to categories as `gpu_hours_wasted.py` does; a software bug or broken
               dependency recurs at the same step until fixed. Of GPU faults, the share that stays on
               the node until it is repaired is Crusoe's H200 split (host replacement 41.5 % against
               GPU recoverable 19.5 %, GTC25).
    opt-h200   OPT-175B's interruption rate (mean 7.5 h between interruptions on 992 A100,
               metaseq's logbook as summarised at glennklockwood.com/garden/job-reliability) with
               Crusoe's H200 fault mix (GTC25, glennklockwood.com/garden/component-reliability):
               all hardware and fabric, 58 % of it staying on its node until repaired.

The policies:
    retry-all          a Job with backoffLimit 3: 4 attempts, each from the start the person last set
                       (a from-scratch script); the Job's backoff 10 s doubling to 6 min.
    kubeflow-exit      restartPolicy ExitCode: exit codes 128-255 retried (backoffLimit 3) from the
                       newest checkpoint, 1-127 to a person.
    torchelastic       torchrun --max-restarts=3: restarts the workers in place from the newest
                       checkpoint, no scheduling unless the node is gone; a GPU fault that stays on
                       the node is met again at the first step.
    trainguard         the real classifier and the real retry policy (`decide_retry`, max_attempts 4
                       counted without checkpoint progress), a new node after a hardware fault,
                       periodic checkpoints only.
    trainguard+helper  the same, with the training-side helper: when a replica survives (GPU, node,
                       link failures) the survivors save the last completed step (one step lost);
                       a stop with notice saves the agreed step when the save fits the window; a bug
                       that fails every rank leaves no survivor to save.
    no-retry           every failure goes to a person.

Usage:
    .venv/bin/python benchmarks/goodput.py                    # 16,384 GPUs, both traces, sweep
    .venv/bin/python benchmarks/goodput.py --gpus 2048 --runs 100 --no-sweep
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_hours_wasted as replay  # noqa: E402
from gpu_hours_wasted import BUDGET, PERSISTENT, Failure, diagnose, draw, exit_code  # noqa: E402

from trainguard.core import policy as retry_policy  # noqa: E402
from trainguard.core import triage  # noqa: E402
from trainguard.core.taxonomy import Category  # noqa: E402

CRUSOE_STAYS = 41.5 / (41.5 + 19.5)  # GPU faults needing the host replaced, of all GPU faults


@dataclass(frozen=True)
class Trace:
    name: str
    source: str
    failures_per_gpu_hour: float
    mix: dict[str, tuple[int, Category]]
    stays: dict[str, float]  # root cause -> share of its failures that stay on the node until repaired
    measured_gpus: int  # the scale the source measured


LLAMA3 = Trace(
    "llama3",
    "Llama 3 405B, 419 unexpected interruptions in 54 days on 16,384 GPUs (arXiv 2407.21783, Table 5); "
    "GPU faults staying on the node: Crusoe H200 split, GTC25",
    replay.FAILURES_PER_GPU_HOUR, replay.LLAMA3_INTERRUPTIONS,
    {cause: CRUSOE_STAYS for cause, (_, category) in replay.LLAMA3_INTERRUPTIONS.items()
     if category is Category.GPU_FAULT}, replay.LLAMA3_GPUS)
# Crusoe's H200 fault causes (% of cases, GTC25) and OPT-175B's interruption rate.
OPT_H200 = Trace(
    "opt-h200",
    "OPT-175B interruption rate, mean 7.5 h on 992 A100 (metaseq logbook, via "
    "glennklockwood.com/garden/job-reliability); fault mix: Crusoe H200 cluster, GTC25 (via "
    "glennklockwood.com/garden/component-reliability)",
    1 / (7.5 * 992),
    {"GPU recoverable fault": (195, Category.GPU_FAULT), "GPU host replacement": (415, Category.GPU_FAULT),
     "Other host issue": (49, Category.NODE_FAILURE), "InfiniBand recoverable fault": (49, Category.NCCL_ERROR),
     "InfiniBand hardware": (122, Category.NCCL_ERROR), "InfiniBand other": (170, Category.NCCL_ERROR)},
    {"GPU host replacement": 1.0, "Other host issue": 1.0, "InfiniBand hardware": 1.0}, 992)
TRACES = {t.name: t for t in (LLAMA3, OPT_H200)}

# A replica survives these (data-parallel copies elsewhere hold the state): the helper's survivors
# save just in time. A bug or a broken dependency fails every rank at once: no survivor.
SURVIVABLE = frozenset({Category.GPU_FAULT, Category.NODE_FAILURE, Category.NCCL_ERROR})
NODE_GONE = frozenset({Category.NODE_FAILURE, Category.PREEMPTED})  # the pod must be placed anew
HANG = "NCCL Watchdog Timeouts"  # seen only when the collective times out


@dataclass(frozen=True)
class Params:
    """Every time the replay charges, in seconds, with where it comes from (`sources`)."""

    detect: float = 3.0
    hang_detect: float = 600.0
    evidence: float = 1.45
    judgement: float = 0.0  # measured at start-up (`measure_judgement`)
    schedule: float = 5.0
    person_hours: float = 0.5
    notice_window: float = 30.0
    blocking_save: float = 0.78
    state_bytes_per_gpu: float = 405e9 * 16 / 16_384
    storage_bytes_per_second: float = 2e12
    step_seconds: float = 6 * 405e9 * 16e6 / (16_384 * 400e12)

    def init(self, gpus: int) -> float:
        """Initialisation (process group, NCCL communicators, model build) at `gpus`."""
        # MegaScale: < 5 s on 2,048 GPUs, < 30 s beyond 10,000 (12,288 measured); log-linear between
        # and extrapolated past it.
        if gpus <= 2048:
            return 5.0
        return 5.0 + 25.0 * math.log2(gpus / 2048) / math.log2(12_288 / 2048)

    def write(self, gpus: int) -> float:
        """A whole checkpoint written (or read) at the storage's sustained bandwidth."""
        return gpus * self.state_bytes_per_gpu / self.storage_bytes_per_second

    def checkpoint_hours(self, failures_per_hour: float) -> float:
        """Young and Daly's interval for the blocking save at that failure rate: sqrt(2 x save x MTBF)."""
        return math.sqrt(2 * self.blocking_save / 3600 / failures_per_hour)

    def sources(self, gpus: int) -> dict[str, str]:
        return {
            "checkpoint interval": "Young's first-order optimum (Young 1974, Daly 2006), sqrt(2 x blocking "
            "save x mean time between the failures that go back to the periodic checkpoint), per policy, "
            "unless --checkpoint-hours is given",
            "detection (a rank or node lost)": f"{self.detect:g} s: measured, benchmarks/supervision_load.py "
            "(8 pods on kubesim): the survivors fail on their own within 3 s of the first",
            "detection (a hang)": f"{self.hang_detect:g} s: PyTorch's default NCCL collective timeout "
            "(init_process_group timeout, 10 min); every policy waits for it",
            "evidence (trainguard)": f"{self.evidence:g} s: measured, benchmarks/supervision_load.py: first "
            "failure to judged, median 4.45 s, less the 3 s of detection",
            "judgement (trainguard)": f"{self.judgement * 1000:.1f} ms: measured in this run, the real "
            "triage.classify and decide_retry over corpus excerpts, median",
            "backoff": "trainguard: the decision's delay (RetryPolicy default 10 s); Job/Kubeflow: "
            "10 s doubling, capped at 6 min (Kubernetes Job pod failure backoff); torchelastic: none",
            "scheduling (pods placed and started)": f"{self.schedule:g} s: Kubernetes scalability SLO, "
            "pod startup latency p99 <= 5 s (sig-scalability); torchelastic in place: 0",
            "initialisation": f"{self.init(gpus):.1f} s at {gpus:,} GPUs: MegaScale (arXiv 2402.15627): "
            "< 5 s on 2,048 GPUs, < 30 s beyond 10,000; log-linear in GPUs between, extrapolated past",
            "checkpoint write / load": f"{self.write(gpus):.1f} s at {gpus:,} GPUs: 405B params x 16 B "
            f"(mixed-precision Adam) over 16,384 GPUs = {self.state_bytes_per_gpu / 1e6:.0f} MB a GPU, at "
            "Tectonic's 2 TB/s sustained (Llama 3, arXiv 2407.21783 s3.3.1)",
            "periodic save, blocking": f"{self.blocking_save:g} s: PyTorch async distributed checkpoint, "
            "Llama3-70B on 1,856 H200 (PyTorch blog)",
            "one training step": f"{self.step_seconds:.1f} s: Llama 3 405B, 16M-token batch at ~400 "
            "TFLOPS/GPU on 16,384 H100 (arXiv 2407.21783), kept per GPU as the job scales",
            "notice window": f"{self.notice_window:g} s: Kubernetes terminationGracePeriodSeconds default",
            "waiting for a person": f"{self.person_hours:g} h: Google SRE book, 'Being On-Call': 30-minute "
            "response for services that are not user-facing",
        }


def measure_judgement(samples: int = 40) -> float:
    """Median seconds of the real triage (rules' scan included) and retry decision on corpus excerpts."""
    excerpts = replay.load_excerpts()
    rows = [(category, row) for category, rows in sorted(excerpts.items()) for row in rows]
    rng = random.Random(7)
    times = []
    for category, row in rng.sample(rows, min(samples, len(rows))):
        events = row.get("events")
        start = time.perf_counter()
        diagnosis = triage.classify(triage.Signals(
            exit_code=exit_code(Failure(1.0, category, row)), reason=row.get("reason") or None,  # type: ignore[arg-type]
            events=tuple(events) if isinstance(events, list) else (),
            log=row.get("log"), error_files=replay.error_files(row)))  # type: ignore[arg-type]
        if diagnosis is not None:
            record = retry_policy.AttemptRecord(1, diagnosis.category, diagnosis.retryable, diagnosis.fingerprint)
            retry_policy.decide_retry(retry_policy.RetryPolicy(max_attempts=BUDGET), [record], ["step-1"])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Draw:
    failure: Failure
    stays: bool  # the fault stays on the node until it is repaired


class RunDraws:
    """One run's failure draws, made on demand and the same for every policy."""

    def __init__(self, seed: str, trace: Trace, rate: float,
                 excerpts: dict[Category, list[dict[str, object]]]) -> None:
        self.rng = random.Random(seed)
        self.trace, self.rate, self.excerpts = trace, rate, excerpts
        self.draws: list[Draw] = []

    def __getitem__(self, index: int) -> Draw:
        while len(self.draws) <= index:
            failure = draw(self.rng, self.rate, self.excerpts, self.trace.mix)
            self.draws.append(Draw(failure, self.rng.random() < self.trace.stays.get(failure.cause, 0.0)))
        return self.draws[index]


PHASES = ("detection", "evidence", "judgement", "backoff", "scheduling", "initialisation", "checkpoint_load")


@dataclass
class Ledger:
    """Hours of one run's elapsed time, by where they went."""

    useful: float = 0.0
    trained: float = 0.0  # training on attempts that could succeed, kept or not
    restart: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    saving: float = 0.0
    doomed: float = 0.0
    waiting: float = 0.0
    attempts: int = 0
    handovers: int = 0
    handed_over_at: list[str] = field(default_factory=list)  # the failure's category at each hand-over

    @property
    def lost(self) -> float:
        return self.trained - self.useful

    @property
    def elapsed(self) -> float:
        return self.trained + sum(self.restart.values()) + self.saving + self.doomed + self.waiting


@dataclass
class State:
    """What a policy knows of the run it replays."""

    gpus: int
    params: Params
    checkpoint_hours: float
    progress: float = 0.0  # newest checkpoint, training hours
    base: float = 0.0  # where a from-scratch restart starts: the person's last resume point
    saved: list[float] = field(default_factory=list)  # checkpoints saved, oldest first
    names: list[str] = field(default_factory=list)  # their names, newest first as a listing shows them
    bug: Failure | None = None
    bug_at: float = 0.0
    bad_node: Failure | None = None  # a fault that stays on the node the job restarts in place on
    since_person: int = 0  # attempts since the run was last (re)started by a person
    history: list[retry_policy.AttemptRecord] = field(default_factory=list)
    previous: list[triage.Diagnosis] = field(default_factory=list)

    def name(self, hours: float) -> str:
        return f"step-{round(hours * 3600 / self.params.step_seconds)}"

    def save(self, hours: float) -> None:
        if not self.saved or hours > self.saved[-1]:
            self.saved.append(hours)
            self.names.insert(0, self.name(hours))


@dataclass(frozen=True)
class Policy:
    name: str
    decide: Callable[[State, Failure, float, float], tuple[bool, float]]  # -> (retry, backoff seconds)
    resume: bool = True  # restarts from the newest checkpoint (else from where a person last set it)
    in_place: bool = False  # restarts the workers on the nodes they had
    helper: bool = False  # the training-side helper: just-in-time and notice checkpoints
    tells: bool = False  # collects evidence and judges (trainguard)


def job_backoff(state: State) -> float:
    return float(min(10 * 2 ** (state.since_person - 1), 360))


def retry_all(state: State, failure: Failure, start: float, newest: float) -> tuple[bool, float]:
    return state.since_person < BUDGET, job_backoff(state)


def kubeflow_exit_code(state: State, failure: Failure, start: float, newest: float) -> tuple[bool, float]:
    return state.since_person < BUDGET and 128 <= exit_code(failure) <= 255, job_backoff(state)


def torchelastic(state: State, failure: Failure, start: float, newest: float) -> tuple[bool, float]:
    return state.since_person < BUDGET, 0.0


def no_retry(state: State, failure: Failure, start: float, newest: float) -> tuple[bool, float]:
    return False, 0.0


def trainguard(state: State, failure: Failure, start: float, newest: float) -> tuple[bool, float]:
    """The real classifier and retry policy, each attempt on a node of its own after a hardware fault."""
    diagnosis = diagnose(failure, state.previous)
    number = len(state.history) + 1
    state.history.append(retry_policy.AttemptRecord(
        number, diagnosis.category, diagnosis.retryable, diagnosis.fingerprint,
        resumed_from=state.name(start) if start else None,
        newest_checkpoint=state.name(newest) if newest else None, node=f"node-{number}"))
    decision = retry_policy.decide_retry(retry_policy.RetryPolicy(max_attempts=BUDGET), state.history, state.names)
    return decision.retry, decision.delay_seconds


POLICIES = (
    Policy("retry-all (Job backoffLimit 3)", retry_all, resume=False),
    Policy("Kubeflow ExitCode", kubeflow_exit_code),
    Policy("torchelastic max_restarts=3", torchelastic, in_place=True),
    Policy("trainguard, periodic checkpoints", trainguard, tells=True),
    Policy("trainguard + helper", trainguard, helper=True, tells=True),
    Policy("no retry", no_retry),
)
BASELINE = POLICIES[0].name


def replay_run(policy: Policy, draws: RunDraws, gpus: int, params: Params, job_hours: float,
               checkpoint_hours: float) -> Ledger:
    """One run under one policy, until its training is done."""
    led = Ledger(useful=job_hours)
    state = State(gpus, params, checkpoint_hours)
    pending: dict[str, float] = {}  # the restart before the next attempt, seconds by phase
    index = 0
    while True:
        start = state.progress if policy.resume else state.base
        in_place_fault = state.bad_node if policy.in_place else None
        doomed = in_place_fault is not None or (state.bug is not None and start < state.bug_at)
        restart_hours = sum(pending.values()) / 3600
        if doomed:
            led.doomed += restart_hours
        else:
            for phase, seconds in pending.items():
                led.restart[phase] += seconds / 3600
        led.attempts += 1
        state.since_person += 1
        drawn = draws[index]
        index += 1
        failure, stays, ends = drawn.failure, drawn.stays, start + drawn.failure.after_hours
        if in_place_fault is not None:  # the broken GPU is still there: the first step fails again
            failure, stays, ends = in_place_fault, True, start + params.step_seconds / 3600
        elif state.bug is not None and start < state.bug_at <= ends:
            failure, stays, ends = state.bug, False, state.bug_at
        done = ends >= job_hours
        ends = min(ends, job_hours)
        saves = int((ends - start) / checkpoint_hours)
        led.saving += saves * params.blocking_save / 3600
        if doomed:
            led.doomed += ends - start
        else:
            led.trained += ends - start
        if done:
            return led
        # The newest checkpoint when the attempt ends: periodic, or the helper's.
        periodic = start + saves * checkpoint_hours
        newest = periodic
        for n in range(1, saves + 1):
            state.save(start + n * checkpoint_hours)
        if policy.helper and failure is not state.bug and in_place_fault is None:
            write = params.write(gpus)
            if failure.category in SURVIVABLE:
                newest = max(ends - params.step_seconds / 3600, periodic)
                led.saving += write / 3600
            elif failure.category is Category.PREEMPTED and write <= params.notice_window:
                newest = ends
                led.saving += write / 3600
            if newest > periodic:
                state.save(newest)
        state.progress = max(state.progress, newest)  # from-scratch restarts leave it for a person
        if failure.category in PERSISTENT and state.bug is None:
            state.bug, state.bug_at = failure, ends
        if stays and policy.in_place and failure.category is Category.GPU_FAULT:
            state.bad_node = failure
        retry, backoff = policy.decide(state, failure, start, state.saved[-1] if state.saved else 0.0)
        detect = params.hang_detect if failure.cause == HANG else params.detect
        resumes_from = state.progress if policy.resume else state.base
        if retry:
            placed = not policy.in_place or failure.category in NODE_GONE
            pending = {"detection": detect, "backoff": backoff,
                       "evidence": params.evidence if policy.tells else 0.0,
                       "judgement": params.judgement if policy.tells else 0.0,
                       "scheduling": params.schedule if placed else 0.0,
                       "initialisation": params.init(gpus),
                       "checkpoint_load": params.write(gpus) if resumes_from else 0.0}
            continue
        # A person: the cause that stays is removed, the run resumed from the newest checkpoint.
        led.handovers += 1
        led.handed_over_at.append(failure.category.value + (" (stays)" if failure is state.bug else ""))
        led.waiting += params.person_hours
        state.bug, state.bad_node = None, None
        state.base = state.progress
        state.since_person = 0
        state.history.clear()
        state.previous.clear()
        pending = {"detection": detect, "evidence": params.evidence if policy.tells else 0.0,
                   "judgement": params.judgement if policy.tells else 0.0,
                   "scheduling": params.schedule, "initialisation": params.init(gpus),
                   "checkpoint_load": params.write(gpus) if state.progress else 0.0}


def rolled_back(policy: Policy, trace: Trace, params: Params, gpus: int) -> float:
    """The share of the trace's failures that go back to the newest periodic checkpoint under `policy`."""
    if not policy.helper:
        return 1.0
    saved = sum(n for n, category in trace.mix.values() if category in SURVIVABLE or (
        category is Category.PREEMPTED and params.write(gpus) <= params.notice_window))
    return max(1.0 - saved / sum(n for n, _ in trace.mix.values()), 1e-3)


def run_policies(trace: Trace, gpus: int, runs: int, job_hours: float, checkpoint_hours: float | None,
                 params: Params, seed: int) -> dict[str, dict[str, object]]:
    """Every policy over the same `runs` runs: the breakdown, the waste and the people needed.

    `checkpoint_hours` None: each policy checkpoints at Young's interval for the failures that send
    it back to its periodic checkpoint (all of them, or with the helper those no survivor or notice saves).
    """
    excerpts = replay.load_excerpts()
    rate = trace.failures_per_gpu_hour * gpus
    all_draws = [RunDraws(f"{seed}-{trace.name}-{gpus}-{i}", trace, rate, excerpts) for i in range(runs)]
    rows: dict[str, dict[str, object]] = {}
    for policy in POLICIES:
        interval = checkpoint_hours or params.checkpoint_hours(rate * rolled_back(policy, trace, params, gpus))
        ledgers = [replay_run(policy, d, gpus, params, job_hours, interval) for d in all_draws]
        elapsed = sum(led.elapsed for led in ledgers)
        parts = {
            "training_that_counts": sum(led.useful for led in ledgers),
            "progress_lost": sum(led.lost for led in ledgers),
            **{f"restart_{phase}": sum(led.restart[phase] for led in ledgers) for phase in PHASES},
            "checkpoint_saving": sum(led.saving for led in ledgers),
            "could_not_succeed": sum(led.doomed for led in ledgers),
            "waiting_for_a_person": sum(led.waiting for led in ledgers),
        }
        rows[policy.name] = {
            "effective_training_time": parts["training_that_counts"] / elapsed,
            "breakdown_percent": {k: 100 * v / elapsed for k, v in parts.items()},
            "gpu_hours_wasted": (elapsed - parts["training_that_counts"]) * gpus,
            "attempts": sum(led.attempts for led in ledgers),
            "runs_finished_without_a_person": sum(led.handovers == 0 for led in ledgers),
            "hand_overs_to_a_person": sum(led.handovers for led in ledgers),
            "hand_overs_by_category": dict(sorted(Counter(
                c for led in ledgers for c in led.handed_over_at).items(), key=lambda kv: -kv[1])),
            "checkpoint_minutes": round(interval * 60, 2),
        }
    baseline = float(rows[BASELINE]["gpu_hours_wasted"])  # type: ignore[arg-type]
    for row in rows.values():
        wasted = float(row["gpu_hours_wasted"])  # type: ignore[arg-type]
        row["waste_below_retry_all"] = 1 - wasted / baseline if baseline else 0.0
    return rows


def table(rows: dict[str, dict[str, object]]) -> str:
    """The rows as the Markdown table the docs show."""
    head = ("| policy | effective training time | progress lost | restart | checkpoint saving | "
            "could not succeed | waiting for a person | GPU-h wasted | vs retry-all | runs without a person |")
    lines = [head, "|" + "---|" * 10]
    for name, row in rows.items():
        b: dict[str, float] = row["breakdown_percent"]  # type: ignore[assignment]
        restart = sum(v for k, v in b.items() if k.startswith("restart_"))
        lines.append(
            f"| {name} | {100 * float(row['effective_training_time']):.2f} % | {b['progress_lost']:.2f} % | "  # type: ignore[arg-type]
            f"{restart:.2f} % | {b['checkpoint_saving']:.2f} % | {b['could_not_succeed']:.2f} % | "
            f"{b['waiting_for_a_person']:.2f} % | {float(row['gpu_hours_wasted']):,.0f} | "  # type: ignore[arg-type]
            f"{100 * float(row['waste_below_retry_all']):.1f} % less | "  # type: ignore[arg-type]
            f"{row['runs_finished_without_a_person']} |")
    return "\n".join(lines)


def rounded(rows: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, row in rows.items():
        out[name] = {k: (round(v, 4) if isinstance(v, float) else
                         {p: round(x, 3) for p, x in v.items()} if isinstance(v, dict) else v)
                     for k, v in row.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--job-hours", type=float, default=72.0)
    parser.add_argument("--checkpoint-hours", type=float, default=None,
                        help="every policy's checkpoint interval (default: Young's optimum at the scale)")
    parser.add_argument("--person-hours", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--sweep-runs", type=int, default=10)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    params = Params(judgement=measure_judgement(), person_hours=args.person_hours)
    print("# parameters, each with its source")
    for key, text in params.sources(args.gpus).items():
        print(f"  {key}: {text}")
    # The Llama 3 mix at the asked scale; the other trace at the scale its source measured.
    for trace, gpus in ((LLAMA3, args.gpus), (OPT_H200, 1024)):
        started = time.perf_counter()
        rate = trace.failures_per_gpu_hour * gpus
        rows = run_policies(trace, gpus, args.runs, args.job_hours, args.checkpoint_hours, params, args.seed)
        print(f"\n# {trace.name}: {args.runs} runs of {args.job_hours:g} h on {gpus:,} GPUs, a failure every "
              f"{1 / rate:.2f} h ({time.perf_counter() - started:.1f} s)")
        print(f"# source: {trace.source}")
        print(table(rows))
        print(json.dumps(rounded(rows), indent=1))
    if args.no_sweep:
        return
    print(f"\n# scale sweep, llama3, {args.sweep_runs} runs each: effective training time; "
          "GPU-hours wasted below retry-all")
    names = [p.name for p in POLICIES]
    print("| GPUs | h between failures | " + " | ".join(names) + " |")
    print("|" + "---|" * (len(names) + 2))
    for gpus in (1024, 4096, 16_384, 32_768, 65_536, 131_072):
        rate = LLAMA3.failures_per_gpu_hour * gpus
        rows = run_policies(LLAMA3, gpus, args.sweep_runs, args.job_hours, args.checkpoint_hours, params, args.seed)
        cells = [f"{100 * float(rows[n]['effective_training_time']):.1f} %"  # type: ignore[arg-type]
                 f" ({100 * float(rows[n]['waste_below_retry_all']):.0f} %)" for n in names]  # type: ignore[arg-type]
        print(f"| {gpus:,} | {1 / (LLAMA3.failures_per_gpu_hour * gpus):.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
