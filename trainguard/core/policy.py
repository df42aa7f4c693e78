"""The retry policy: given what the attempts of a run did, decide whether another attempt can help.

Pure functions over frozen values: no Prefect, no clock, no I/O. The flow asks `decide`, the state
hooks (and the notebook driver) only carry the decision out, so one policy serves every driver.
What *kind* of failure an attempt had is `triage`'s business; this module only weighs the
taxonomy category, the user's overrides, the budget and the circuit breaker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType

from trainguard.core.taxonomy import INFO, Category

MAX_MEMORY_FACTOR = 4.0
"""The most an opt-in host_oom policy may scale an attempt's memory request and limit, over the run."""


class Backoff(str, enum.Enum):
    """How the wait before the next attempt grows."""

    FIXED = "fixed"
    EXPONENTIAL = "exponential"


@dataclass(frozen=True)
class CategoryOverride:
    """A user's (or the default) change to how one category is retried; None keeps the policy's value."""

    retryable: bool | None = None
    max_attempts: int | None = None
    delay_seconds: float | None = None


# Platform failures happen to the run, not because of it: neither a repeated signature nor a lack
# of checkpoint progress says anything about whether the next attempt will get further.
PLATFORM_CAUSED = frozenset({Category.PREEMPTED, Category.NODE_FAILURE, Category.UNSCHEDULABLE})

# The taxonomy's "retry once" categories and the one that wants a longer wait.
DEFAULT_OVERRIDES: Mapping[Category, CategoryOverride] = MappingProxyType(
    {
        Category.NATIVE_CRASH: CategoryOverride(max_attempts=2),
        Category.UNKNOWN: CategoryOverride(max_attempts=2),
        Category.UNSCHEDULABLE: CategoryOverride(delay_seconds=60.0),
    }
)


@dataclass(frozen=True)
class RetryPolicy:
    """How a run is retried. Defaults follow the rules of thumb: 3 attempts, short fixed backoff.

    The attempt budget is spent by failures without progress, not by failures over days: an attempt
    that moved the checkpoint forward refills it. `max_attempts` counts the attempts in a row, up to
    and including the last, that saved no newer checkpoint than the one they resumed from (a long
    run meets hardware faults at a steady rate, so a budget of attempts in all would stop it for no
    fault of its own). `max_total_attempts`, when set, bounds the attempts of the run in all, as a
    Kubernetes Job's backoffLimit does.
    """

    max_attempts: int = 3
    max_total_attempts: int | None = None
    backoff: Backoff = Backoff.FIXED
    delay_seconds: float = 10.0
    max_delay_seconds: float = 300.0
    same_signature_limit: int = 2
    require_checkpoint_progress: bool = True
    overrides: Mapping[Category, CategoryOverride] = field(default_factory=dict)
    host_oom_memory_factor: float = 1.0  # > 1: a retried host_oom attempt gets this much more memory

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.max_total_attempts is not None and self.max_total_attempts < 1:
            raise ValueError("max_total_attempts must be at least 1 (or None: no bound on attempts in all)")
        if self.delay_seconds < 0 or self.max_delay_seconds < 0:
            raise ValueError("delay_seconds and max_delay_seconds must not be negative")
        if self.same_signature_limit < 0:
            raise ValueError("same_signature_limit must not be negative (0 turns the breaker off)")
        if not 1.0 <= self.host_oom_memory_factor <= MAX_MEMORY_FACTOR:
            raise ValueError(f"host_oom_memory_factor must be between 1 (off) and {MAX_MEMORY_FACTOR:g}")

    def override_for(self, category: Category) -> CategoryOverride:
        """The user's override for `category`, falling back field by field to the default one."""
        user = self.overrides.get(category, CategoryOverride())
        default = DEFAULT_OVERRIDES.get(category, CategoryOverride())
        return CategoryOverride(
            retryable=user.retryable if user.retryable is not None else default.retryable,
            max_attempts=user.max_attempts if user.max_attempts is not None else default.max_attempts,
            delay_seconds=user.delay_seconds if user.delay_seconds is not None else default.delay_seconds,
        )


@dataclass(frozen=True)
class AttemptRecord:
    """What the policy needs to know of one finished attempt."""

    attempt: int
    category: Category | None  # None: the attempt succeeded
    retryable: bool
    fingerprint: str = ""
    resumed_from: str | None = None
    newest_checkpoint: str | None = None  # newest checkpoint when the attempt ended
    node: str | None = None
    memory_factor: float = 1.0  # how much the attempt's memory request and limit were scaled


@dataclass(frozen=True)
class RetryDecision:
    """The outcome of `decide`; `reason` is always a sentence a person can act on."""

    retry: bool
    reason: str
    next_attempt: int | None = None
    delay_seconds: float = 0.0
    resume_from: str | None = None
    avoid_nodes: tuple[str, ...] = ()
    budget: int | None = None  # attempts in a row without checkpoint progress this failure's category allows
    memory_factor: float = 1.0  # the next attempt's memory scale (see RetryPolicy.host_oom_memory_factor)
    without_progress: int | None = None  # the attempts in a row, the decided one included, that made none
    total_budget: int | None = None  # the run's attempts in all (RetryPolicy.max_total_attempts), None: no bound
    planned: str | None = None  # the reason of a retry this decision planned that was never made (a stop came first)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form, for flow results, events and reports."""
        return {**asdict(self), "avoid_nodes": list(self.avoid_nodes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RetryDecision:
        """The decision `to_dict` wrote, e.g. read back from a flow state's data."""
        nodes = data.get("avoid_nodes") or ()
        delay = data.get("delay_seconds") or 0.0
        next_attempt = data.get("next_attempt")
        resume_from = data.get("resume_from")
        budget = data.get("budget")
        factor = data.get("memory_factor")
        return cls(
            retry=bool(data.get("retry")),
            reason=str(data.get("reason", "")),
            next_attempt=int(next_attempt) if isinstance(next_attempt, int) else None,
            delay_seconds=float(delay) if isinstance(delay, (int, float)) else 0.0,
            resume_from=str(resume_from) if resume_from else None,
            avoid_nodes=tuple(str(n) for n in nodes) if isinstance(nodes, (list, tuple)) else (),
            budget=_count(budget),
            without_progress=_count(data.get("without_progress")),
            total_budget=_count(data.get("total_budget")),
            memory_factor=float(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else 1.0,
            planned=str(planned) if (planned := data.get("planned")) is not None else None,
        )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def backoff_seconds(policy: RetryPolicy, failed_attempt: int, category: Category) -> float:
    """The wait before the attempt after `failed_attempt` (1-based)."""
    override = policy.override_for(category).delay_seconds
    base = policy.delay_seconds if override is None else override
    if policy.backoff is Backoff.FIXED:
        return base
    return float(min(base * 2 ** (failed_attempt - 1), max(policy.max_delay_seconds, base)))


def decide_retry(
    policy: RetryPolicy, history: Sequence[AttemptRecord], checkpoints: Sequence[str] = ()
) -> RetryDecision:
    """Decide whether the run gets another attempt after the last one in `history`.

    Args:
        policy: the run's retry policy.
        history: every finished attempt of the run, oldest first; the last one is being decided on.
        checkpoints: the run's checkpoints as they are now, newest first.

    Returns:
        The decision, with the reason, the wait, the checkpoint to resume from and nodes to avoid.
    """
    if not history:
        raise ValueError("decide needs at least the attempt that just finished")
    last = history[-1]
    if last.category is None:
        return RetryDecision(False, f"attempt {last.attempt} succeeded")
    budget = _budget(policy, last.category)
    stalled = without_progress(history, checkpoints)
    refusal = _refusal(policy, history, checkpoints)
    if refusal:
        return RetryDecision(False, refusal, budget=budget, without_progress=stalled,
                             total_budget=policy.max_total_attempts)
    resume_from, resume_note = _resume_point(last, checkpoints)
    delay = backoff_seconds(policy, last.attempt, last.category)
    avoid = _nodes_to_avoid(history)
    factor, memory_note = _memory_factor(policy, last)
    in_all = f", {last.attempt + 1} of {policy.max_total_attempts} in all" if policy.max_total_attempts else ""
    reason = (
        f"{last.category.value} is retryable: attempt {last.attempt + 1}, {stalled + 1} of {budget} "
        f"without checkpoint progress{in_all}, in {delay:g}s, {resume_note}{memory_note}"
    )
    return RetryDecision(True, reason, last.attempt + 1, delay, resume_from, avoid, budget, factor, stalled,
                         policy.max_total_attempts)


def progressed(record: AttemptRecord, checkpoints: Sequence[str] = ()) -> bool:
    """The attempt moved the checkpoint forward: its newest checkpoint is newer than the one it resumed from.

    `checkpoints` (the run's, newest first) orders the two when both are in it; otherwise a newest
    checkpoint other than the one resumed from is a new one.
    """
    newest, resumed = record.newest_checkpoint, record.resumed_from
    if newest is None or newest == resumed:
        return False
    if resumed is not None and newest in checkpoints and resumed in checkpoints:
        return checkpoints.index(newest) < checkpoints.index(resumed)
    return True


def without_progress(history: Sequence[AttemptRecord], checkpoints: Sequence[str] = ()) -> int:
    """How many attempts in a row, up to and including the last one in `history`, made no checkpoint progress."""
    count = 0
    for record in reversed(history):
        if progressed(record, checkpoints):
            break
        count += 1
    return count


def budget_spent(policy: RetryPolicy, history: Sequence[AttemptRecord], checkpoints: Sequence[str] = ()) -> str | None:
    """Why the run's attempt budget allows no attempt after the last one in `history`, or None when it does.

    The budget of the last failure's category counts the attempts in a row without checkpoint
    progress; `max_total_attempts`, when set, counts them all. A succeeded last attempt leaves nothing to spend.
    """
    if not history or history[-1].category is None:
        return None
    last = history[-1]
    assert last.category is not None
    total = policy.max_total_attempts
    if total is not None and last.attempt >= total:
        return f"attempt budget spent: {last.attempt} of {total} attempts in all (max_total_attempts)"
    budget = _budget(policy, last.category)
    stalled = without_progress(history, checkpoints)
    if stalled >= budget:
        return (f"attempt budget spent: {stalled} of {budget} attempts in a row without checkpoint progress "
                f"({last.category.value})")
    return None


def _memory_factor(policy: RetryPolicy, last: AttemptRecord) -> tuple[float, str]:
    """The next attempt's memory scale: raised after a host OOM when the policy opts in, else kept.

    The scale compounds over the run's host OOMs and stops at MAX_MEMORY_FACTOR.
    """
    current = min(max(last.memory_factor, 1.0), MAX_MEMORY_FACTOR)
    if last.category is not Category.HOST_OOM or policy.host_oom_memory_factor <= 1.0:
        return current, ""
    raised = min(current * policy.host_oom_memory_factor, MAX_MEMORY_FACTOR)
    if raised <= current:
        return current, f"; memory stays at {current:g}x, the cap of {MAX_MEMORY_FACTOR:g}x"
    return raised, f"; memory request and limit raised to {raised:g}x"


def _retryable(policy: RetryPolicy, record: AttemptRecord) -> bool:
    assert record.category is not None
    override = policy.override_for(record.category).retryable
    return record.retryable if override is None else override


def _budget(policy: RetryPolicy, category: Category) -> int:
    override = policy.override_for(category).max_attempts
    return policy.max_attempts if override is None else min(override, policy.max_attempts)


def _refusal(policy: RetryPolicy, history: Sequence[AttemptRecord],
             checkpoints: Sequence[str] = ()) -> str | None:
    """Why there must be no further attempt, or None when one may follow."""
    last = history[-1]
    assert last.category is not None
    category = last.category.value
    if not _retryable(policy, last):
        if last.category is Category.USER_CANCELLED:
            return f"{category} is not retryable: someone stopped it on purpose"
        return f"{category} is not retryable: the same attempt would fail again"
    if spent := budget_spent(policy, history, checkpoints):
        return spent
    limit = policy.same_signature_limit
    recent = history[-limit:] if limit else ()
    repeated = len(recent) == limit and len({_signature(r) for r in recent}) == 1 and last.fingerprint
    if limit and repeated and last.category not in PLATFORM_CAUSED and not _moved(recent) \
            and not _outlasted(recent, checkpoints):
        if last.category is Category.UNKNOWN:
            return (f"circuit breaker: {limit} unknown failures in a row, nothing recognised in any "
                    "(an unknown failure is retried once)")
        return (
            f"circuit breaker: the same failure signature repeated {limit} times in a row "
            f"({category}, fingerprint {last.fingerprint[:12]})"
        )
    if policy.require_checkpoint_progress and _stuck(history[-2:]):
        return (
            f"circuit breaker: attempts {last.attempt - 1} and {last.attempt} both resumed from "
            f"{last.resumed_from} and made no checkpoint progress before failing ({category})"
        )
    return None


def _signature(record: AttemptRecord) -> str | None:
    """What the signature breaker compares: the fingerprint of the deciding evidence; for an unknown
    failure, the category alone. Nothing was recognised in either attempt, so the lines that happened
    to decide say nothing of a difference (torchrun's agent that crashed before its failure table
    leaves its closing signal to decide, where the time before its table named the kill), and the
    taxonomy retries an unknown failure once."""
    return Category.UNKNOWN.value if record.category is Category.UNKNOWN else record.fingerprint


def _stuck(records: Sequence[AttemptRecord]) -> bool:
    """Two attempts in a row resumed from the same checkpoint and failed before saving another.

    One attempt that fails before its first checkpoint says little: on a large run the time to
    the next random fault is short (about 3 h at 16,384 GPUs by the Llama 3 interruption rate)
    next to a checkpoint interval of an hour, so about one resumed attempt in four fails before
    saving anything. Two in a row stuck at the same checkpoint is a run that cannot get past it.
    A failure the platform caused, or a hardware fault on a node the next attempt avoided, says
    nothing about the run, so it does not count.
    """
    if len(records) < 2 or records[0].resumed_from != records[1].resumed_from:
        return False
    return all(r.resumed_from is not None and r.newest_checkpoint == r.resumed_from
               and r.category is not None and r.category not in PLATFORM_CAUSED
               and not INFO[r.category].avoid_node for r in records)


def _outlasted(records: Sequence[AttemptRecord], checkpoints: Sequence[str]) -> bool:
    """The repeats of the signature came after different amounts of training: an intermittent fault.

    A failure that will keep coming back does so at the same point: at the same step (no new
    checkpoint) or after as much training as last time (a leak, a timer), so each attempt saves
    as many new checkpoints as the one before, give or take the one the failure fell beside. An
    NCCL error that returns after more, or fewer, new checkpoints than the time before is an
    intermittent fault striking at random (on a large run the same message comes back by chance
    within hours), and the run moves past it; the breaker does not count it. Where the
    checkpoints an attempt saved cannot be counted (pruned, renamed), it counts as usual.
    """
    saved = [_saved(r, checkpoints) for r in records]
    if any(n is None for n in saved) or saved[-1] == 0:
        return False  # uncounted, or back at once at the step it resumed from: the same point
    counts = [n for n in saved if n is not None]
    return max(counts) - min(counts) > 1


def _saved(record: AttemptRecord, checkpoints: Sequence[str]) -> int | None:
    """How many checkpoints the attempt saved, from the run's checkpoints (newest first)."""
    if record.newest_checkpoint is None:
        return 0
    if record.newest_checkpoint not in checkpoints:
        return None
    newest = checkpoints.index(record.newest_checkpoint)
    if record.resumed_from is None:
        return len(checkpoints) - newest
    if record.resumed_from not in checkpoints:
        return None
    return max(checkpoints.index(record.resumed_from) - newest, 0)


def _moved(records: Sequence[AttemptRecord]) -> bool:
    """A hardware fault that followed the run onto other nodes: each attempt on its own node.

    Such a repeat says the fleet has more than one bad node, not that retrying is futile, so the
    circuit breakers do not count it.
    """
    last = records[-1]
    nodes = [r.node for r in records]
    return (last.category is not None and INFO[last.category].avoid_node and len(records) > 1
            and all(nodes) and len(set(nodes)) == len(nodes))


def _resume_point(last: AttemptRecord, checkpoints: Sequence[str]) -> tuple[str | None, str]:
    if not checkpoints:
        return None, "starting from scratch (no checkpoint yet)"
    if last.category is not Category.CHECKPOINT_CORRUPTED:
        return checkpoints[0], f"resuming from the newest checkpoint {checkpoints[0]}"
    bad = last.resumed_from or checkpoints[0]
    if bad in checkpoints:
        older = list(checkpoints[checkpoints.index(bad) + 1 :])
    elif last.resumed_from is not None and _name(bad) not in {_name(c) for c in checkpoints}:
        older = list(checkpoints)  # already left out: its acknowledgement no longer verifies, or it is gone
    else:
        older = list(checkpoints[1:])
    if not older:
        return None, f"starting from scratch: {bad} is unreadable and no older checkpoint exists"
    return older[0], f"resuming from {older[0]}, the checkpoint before the unreadable {bad}"


def _name(checkpoint: str) -> str:
    return checkpoint.rstrip("/").rsplit("/", 1)[-1]


def _nodes_to_avoid(history: Sequence[AttemptRecord]) -> tuple[str, ...]:
    nodes: list[str] = []
    for record in history:
        if record.category is not None and record.node and INFO[record.category].avoid_node:
            if record.node not in nodes:
                nodes.append(record.node)
    return tuple(nodes)
