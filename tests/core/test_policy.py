"""The retry policy as a pure function: budget, retryability, circuit breaker, resume point."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainguard.core.policy import (
    AttemptRecord,
    Backoff,
    CategoryOverride,
    RetryDecision,
    RetryPolicy,
    backoff_seconds,
    decide_retry,
)
from trainguard.core.taxonomy import Category

CKPTS = ("ckpt/step-30.json", "ckpt/step-20.json", "ckpt/step-10.json")


def failed(attempt: int, category: Category, retryable: bool = True, fingerprint: str | None = None, **kw):
    return AttemptRecord(attempt, category, retryable, fingerprint or f"fp-{attempt}", **kw)


def test_a_retryable_failure_is_retried_from_the_newest_checkpoint_after_the_fixed_delay():
    decision = decide_retry(RetryPolicy(delay_seconds=5), [failed(1, Category.NCCL_ERROR)], CKPTS)
    assert decision.retry and decision.next_attempt == 2
    assert decision.delay_seconds == 5
    assert decision.resume_from == "ckpt/step-30.json"
    assert "nccl_error is retryable" in decision.reason


@pytest.mark.parametrize(
    "category",
    [Category.CODE_ERROR, Category.CONFIG_ERROR, Category.DATA_ERROR, Category.CUDA_OOM, Category.DIVERGENCE],
)
def test_a_non_retryable_failure_is_never_retried(category):
    decision = decide_retry(RetryPolicy(), [failed(1, category, retryable=False)], CKPTS)
    assert not decision.retry
    assert f"{category.value} is not retryable" in decision.reason


def test_the_budget_stops_the_run_after_max_attempts():
    history = [failed(1, Category.PREEMPTED), failed(2, Category.NCCL_ERROR), failed(3, Category.TRANSIENT_IO)]
    assert decide_retry(RetryPolicy(), history[:2], CKPTS).retry
    decision = decide_retry(RetryPolicy(), history, CKPTS)
    assert not decision.retry and "budget spent: 3 of 3" in decision.reason


def test_the_same_signature_twice_in_a_row_trips_the_circuit_breaker():
    history = [failed(1, Category.NCCL_ERROR, fingerprint="same"), failed(2, Category.NCCL_ERROR, fingerprint="same")]
    decision = decide_retry(RetryPolicy(max_attempts=5), history, CKPTS)
    assert not decision.retry and "same failure signature repeated 2 times" in decision.reason


def test_two_unknown_failures_in_a_row_are_one_signature_whatever_line_decided_each():
    # torchrun's agent that crashed before its failure table leaves its closing signal to decide where
    # the time before its table named the kill: nothing was recognised either time
    # (the first saved step 30, the second resumed there and saved nothing: as in the run it came from)
    first, second = {"newest_checkpoint": CKPTS[0]}, {"resumed_from": CKPTS[0], "newest_checkpoint": CKPTS[0]}
    history = [failed(1, Category.UNKNOWN, fingerprint="exitcode -9", **first),
               failed(2, Category.UNKNOWN, fingerprint="closing signal SIGTERM", **second)]
    decision = decide_retry(RetryPolicy(max_attempts=5), history, CKPTS)
    assert not decision.retry and "circuit breaker: 2 unknown failures in a row" in decision.reason
    other = [failed(1, Category.NCCL_ERROR, fingerprint="a", **first),
             failed(2, Category.NCCL_ERROR, fingerprint="b", **second)]
    assert decide_retry(RetryPolicy(max_attempts=5), other, CKPTS).retry  # known causes keep their fingerprints


def test_a_signature_that_returns_only_after_more_new_checkpoints_than_last_time_is_outlasted():
    ckpts = tuple(f"ckpt/step-{n}.json" for n in range(90, 0, -10))  # newest first
    nccl = {"category": Category.NCCL_ERROR, "fingerprint": "same"}
    # Attempt 1 saved 2 checkpoints, attempt 2 six more: an intermittent fault, not a repeat.
    longer = [failed(1, newest_checkpoint="ckpt/step-20.json", **nccl),
              failed(2, resumed_from="ckpt/step-20.json", newest_checkpoint="ckpt/step-80.json", **nccl)]
    assert decide_retry(RetryPolicy(max_attempts=5), longer, ckpts).retry
    # The same failure after as much training each time (a leak, a timer) trips the breaker.
    as_long = [failed(1, newest_checkpoint="ckpt/step-10.json", **nccl),
               failed(2, resumed_from="ckpt/step-10.json", newest_checkpoint="ckpt/step-20.json", **nccl)]
    decision = decide_retry(RetryPolicy(max_attempts=5), as_long, ckpts)
    assert not decision.retry and "same failure signature repeated 2 times" in decision.reason
    # Checkpoints that cannot be counted (the older ones pruned) leave the breaker as it was.
    assert not decide_retry(RetryPolicy(max_attempts=5), longer, ckpts[:3]).retry


def test_a_signature_back_after_fewer_new_checkpoints_is_intermittent_and_as_many_within_one_is_not():
    ckpts = tuple(f"ckpt/step-{n}.json" for n in range(90, 0, -10))  # newest first
    nccl = {"category": Category.NCCL_ERROR, "fingerprint": "same"}
    # Six new checkpoints, then two: a fault striking at random, not at the same point.
    fewer = [failed(1, newest_checkpoint="ckpt/step-60.json", **nccl),
             failed(2, resumed_from="ckpt/step-60.json", newest_checkpoint="ckpt/step-80.json", **nccl)]
    decision = decide_retry(RetryPolicy(max_attempts=5), fewer, ckpts)
    assert decision.retry and decision.resume_from == "ckpt/step-90.json"
    # Three, then four: as much training each time, give or take the checkpoint it fell beside.
    alike = [failed(1, newest_checkpoint="ckpt/step-30.json", **nccl),
             failed(2, resumed_from="ckpt/step-30.json", newest_checkpoint="ckpt/step-70.json", **nccl)]
    decision = decide_retry(RetryPolicy(max_attempts=5), alike, ckpts)
    assert not decision.retry and "same failure signature repeated 2 times" in decision.reason
    # No new checkpoint either time stays a repeat.
    stuck = [failed(1, resumed_from="ckpt/step-90.json", newest_checkpoint="ckpt/step-90.json", **nccl),
             failed(2, resumed_from="ckpt/step-90.json", newest_checkpoint="ckpt/step-90.json", **nccl)]
    assert not decide_retry(RetryPolicy(max_attempts=5, require_checkpoint_progress=False), stuck, ckpts).retry
    # Three new checkpoints, then none: back at once at the step it resumed from, the same point.
    at_once = [failed(1, newest_checkpoint="ckpt/step-30.json", **nccl),
               failed(2, resumed_from="ckpt/step-30.json", newest_checkpoint="ckpt/step-30.json", **nccl)]
    decision = decide_retry(RetryPolicy(max_attempts=5, require_checkpoint_progress=False), at_once, ckpts)
    assert not decision.retry and "same failure signature repeated 2 times" in decision.reason


def test_a_breaker_limit_of_zero_turns_the_signature_breaker_off():
    history = [failed(n, Category.NCCL_ERROR, fingerprint="same") for n in (1, 2)]
    assert decide_retry(RetryPolicy(max_attempts=5, same_signature_limit=0), history, CKPTS).retry


def test_two_attempts_in_a_row_stuck_at_one_checkpoint_stop_the_run_and_one_does_not():
    stuck = {"resumed_from": "ckpt/step-30.json", "newest_checkpoint": "ckpt/step-30.json"}
    # One resumed attempt that failed before its first checkpoint: on a large run, a random
    # fault often comes that soon, so it is retried.
    once = [failed(1, Category.TRANSIENT_IO, newest_checkpoint="ckpt/step-30.json"),
            failed(2, Category.NCCL_ERROR, **stuck)]
    assert decide_retry(RetryPolicy(max_attempts=5), once, CKPTS).retry
    # A second one stuck at the same checkpoint: the run cannot get past it.
    twice = [*once, failed(3, Category.TRANSIENT_IO, **stuck)]
    decision = decide_retry(RetryPolicy(max_attempts=5), twice, CKPTS)
    assert not decision.retry
    assert decision.reason == ("circuit breaker: attempts 2 and 3 both resumed from "
                               "ckpt/step-30.json and made no checkpoint progress before failing "
                               "(transient_io)")
    assert decide_retry(RetryPolicy(max_attempts=5, require_checkpoint_progress=False), twice, CKPTS).retry
    # Stuck at different checkpoints is progress between them.
    moved_on = [*once[:1], failed(2, Category.NCCL_ERROR, resumed_from="ckpt/step-20.json",
                                  newest_checkpoint="ckpt/step-20.json"),
                failed(3, Category.NCCL_ERROR, **stuck)]
    assert decide_retry(RetryPolicy(max_attempts=5), moved_on, CKPTS).retry


def test_a_hardware_fault_on_a_node_left_behind_does_not_count_as_the_run_being_stuck():
    stuck = {"resumed_from": "ckpt/step-30.json", "newest_checkpoint": "ckpt/step-30.json"}
    history = [failed(1, Category.NCCL_ERROR, newest_checkpoint="ckpt/step-30.json", node="a"),
               failed(2, Category.GPU_FAULT, node="b", **stuck),
               failed(3, Category.NCCL_ERROR, node="c", **stuck)]
    assert decide_retry(RetryPolicy(max_attempts=5), history, CKPTS).retry


def test_a_preemption_without_progress_is_still_retried_because_the_platform_caused_it():
    last = failed(2, Category.PREEMPTED, resumed_from="ckpt/step-30.json", newest_checkpoint="ckpt/step-30.json")
    assert decide_retry(RetryPolicy(), [failed(1, Category.NCCL_ERROR), last], CKPTS).retry


def test_a_corrupted_checkpoint_resumes_from_the_one_before_it():
    last = failed(2, Category.CHECKPOINT_CORRUPTED, resumed_from="ckpt/step-30.json", newest_checkpoint="ckpt/step-30.json")
    decision = decide_retry(RetryPolicy(require_checkpoint_progress=False), [failed(1, Category.PREEMPTED), last], CKPTS)
    assert decision.retry and decision.resume_from == "ckpt/step-20.json"
    assert "before the unreadable ckpt/step-30.json" in decision.reason


def test_a_corrupted_only_checkpoint_restarts_from_scratch():
    decision = decide_retry(RetryPolicy(), [failed(1, Category.CHECKPOINT_CORRUPTED)], ("ckpt/step-10.json",))
    assert decision.retry and decision.resume_from is None and "from scratch" in decision.reason


def test_a_user_override_makes_a_category_non_retryable_and_says_so():
    policy = RetryPolicy(overrides={Category.NCCL_ERROR: CategoryOverride(retryable=False)})
    decision = decide_retry(policy, [failed(1, Category.NCCL_ERROR)], CKPTS)
    assert not decision.retry and "not retryable" in decision.reason


def test_a_user_override_can_make_a_default_non_retryable_category_retryable():
    policy = RetryPolicy(overrides={Category.CUDA_OOM: CategoryOverride(retryable=True)})
    assert decide_retry(policy, [failed(1, Category.CUDA_OOM, retryable=False)], CKPTS).retry


def test_native_crash_is_retried_once_by_default():
    assert decide_retry(RetryPolicy(), [failed(1, Category.NATIVE_CRASH)], CKPTS).retry
    decision = decide_retry(RetryPolicy(), [failed(1, Category.NATIVE_CRASH), failed(2, Category.NATIVE_CRASH)], CKPTS)
    assert not decision.retry and "2 of 2" in decision.reason


def test_exponential_backoff_doubles_up_to_its_cap():
    policy = RetryPolicy(backoff=Backoff.EXPONENTIAL, delay_seconds=10, max_delay_seconds=25)
    assert [backoff_seconds(policy, n, Category.NCCL_ERROR) for n in (1, 2, 3)] == [10, 20, 25]


def test_unschedulable_waits_longer_by_default():
    assert backoff_seconds(RetryPolicy(delay_seconds=5), 1, Category.UNSCHEDULABLE) == 60


def test_gpu_faults_ask_the_next_attempt_to_avoid_the_node():
    decision = decide_retry(RetryPolicy(), [failed(1, Category.GPU_FAULT, node="gpu-node-7")], CKPTS)
    assert decision.avoid_nodes == ("gpu-node-7",)


def test_success_is_never_retried():
    decision = decide_retry(RetryPolicy(), [AttemptRecord(1, None, False)], CKPTS)
    assert not decision.retry and "succeeded" in decision.reason


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"delay_seconds": -1}, {"same_signature_limit": -1}])
def test_an_impossible_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_a_decision_survives_its_round_trip_through_json_ready_data():
    decision = decide_retry(RetryPolicy(), [failed(1, Category.GPU_FAULT, node="n1")], CKPTS)
    assert RetryDecision.from_dict(decision.to_dict()) == decision


def test_a_gpu_fault_repeating_on_a_different_node_does_not_trip_the_breakers():
    history = [failed(1, Category.GPU_FAULT, node="n1"), failed(2, Category.GPU_FAULT, node="n2")]
    history = [replace(r, fingerprint="same", resumed_from="ckpt-1", newest_checkpoint="ckpt-1")
               for r in history]
    assert decide_retry(RetryPolicy(max_attempts=4), history, CKPTS).retry
    on_one_node = [replace(r, node="n1") for r in history]
    assert not decide_retry(RetryPolicy(max_attempts=4), on_one_node, CKPTS).retry


def test_host_oom_memory_is_raised_only_when_opted_in_compounding_up_to_the_cap():
    retried = {Category.HOST_OOM: CategoryOverride(retryable=True)}
    oom = failed(1, Category.HOST_OOM, retryable=False)
    assert decide_retry(RetryPolicy(overrides=retried), [oom]).memory_factor == 1.0  # off by default
    policy = RetryPolicy(max_attempts=5, overrides=retried, host_oom_memory_factor=1.5,
                         same_signature_limit=0, require_checkpoint_progress=False)
    first = decide_retry(policy, [oom])
    assert first.memory_factor == 1.5 and "memory request and limit raised to 1.5x" in first.reason
    later = decide_retry(policy, [oom, failed(2, Category.HOST_OOM, False, memory_factor=1.5)])
    assert later.memory_factor == 2.25
    capped = decide_retry(policy, [failed(3, Category.HOST_OOM, False, memory_factor=3.5)])
    assert capped.memory_factor == 4.0
    stays = decide_retry(policy, [failed(4, Category.HOST_OOM, False, memory_factor=4.0)])
    assert stays.memory_factor == 4.0 and "the cap of 4x" in stays.reason
    other = decide_retry(policy, [failed(2, Category.NCCL_ERROR, memory_factor=1.5)])  # a raised limit is kept
    assert other.memory_factor == 1.5 and RetryDecision.from_dict(other.to_dict()) == other
    assert RetryDecision.from_dict({"retry": True, "reason": "old"}).memory_factor == 1.0


@pytest.mark.parametrize("factor", [0.5, 4.5])
def test_a_memory_factor_out_of_bounds_is_refused(factor):
    with pytest.raises(ValueError, match="host_oom_memory_factor must be between 1"):
        RetryPolicy(host_oom_memory_factor=factor)


def progressing(attempt: int, category: Category = Category.GPU_FAULT) -> AttemptRecord:
    """An attempt of a long run that saved a checkpoint newer than the one it resumed from."""
    resumed = f"ckpt/step-{attempt - 1}0.json" if attempt > 1 else None
    return failed(attempt, category, resumed_from=resumed, newest_checkpoint=f"ckpt/step-{attempt}0.json",
                  node=f"node-{attempt}")


def test_an_attempt_that_moved_the_checkpoint_forward_refills_the_budget():
    # Seven hardware failures over a long run, each after new checkpoints: none spends the budget.
    history = [progressing(n) for n in range(1, 8)]
    ckpts = tuple(f"ckpt/step-{n}0.json" for n in range(7, 0, -1))
    decision = decide_retry(RetryPolicy(), history, ckpts)
    assert decision.retry and decision.next_attempt == 8
    assert decision.without_progress == 0 and decision.budget == 3
    assert "attempt 8, 1 of 3 without checkpoint progress" in decision.reason
    assert RetryDecision.from_dict(decision.to_dict()) == decision


def test_attempts_without_checkpoint_progress_spend_the_budget_after_a_refill():
    ckpts = ("ckpt/step-20.json", "ckpt/step-10.json")
    stalled = {"resumed_from": "ckpt/step-20.json", "newest_checkpoint": "ckpt/step-20.json"}
    history = [progressing(1), progressing(2), failed(3, Category.PREEMPTED, **stalled)]
    assert decide_retry(RetryPolicy(max_attempts=2), history, ckpts).retry
    history.append(failed(4, Category.PREEMPTED, **stalled))  # platform-caused: no breaker, only the budget
    decision = decide_retry(RetryPolicy(max_attempts=2), history, ckpts)
    assert not decision.retry and decision.without_progress == 2
    assert "budget spent: 2 of 2 attempts in a row without checkpoint progress (preempted)" in decision.reason


def test_an_older_newest_checkpoint_is_no_progress():
    # Resumed from step 20 after it was found unreadable, the attempt fell back and saved nothing newer.
    ckpts = ("ckpt/step-20.json", "ckpt/step-10.json")
    back = failed(1, Category.TRANSIENT_IO, resumed_from="ckpt/step-20.json", newest_checkpoint="ckpt/step-10.json")
    decision = decide_retry(RetryPolicy(max_attempts=1), [back], ckpts)
    assert not decision.retry and "1 of 1 attempts in a row without checkpoint progress" in decision.reason


def test_max_total_attempts_bounds_the_run_in_all_even_with_progress():
    history = [progressing(n) for n in range(1, 5)]
    ckpts = tuple(f"ckpt/step-{n}0.json" for n in range(4, 0, -1))
    assert decide_retry(RetryPolicy(max_total_attempts=5), history, ckpts).retry
    assert "attempt 5, 1 of 3 without checkpoint progress, 5 of 5 in all" in \
        decide_retry(RetryPolicy(max_total_attempts=5), history, ckpts).reason
    history.append(progressing(5))
    decision = decide_retry(RetryPolicy(max_total_attempts=5), history, ckpts)
    assert not decision.retry and "budget spent: 5 of 5 attempts in all (max_total_attempts)" in decision.reason
    assert decision.total_budget == 5
    with pytest.raises(ValueError, match="max_total_attempts"):
        RetryPolicy(max_total_attempts=0)


def test_a_category_override_counts_attempts_without_progress_too():
    policy = RetryPolicy(overrides={Category.NCCL_ERROR: CategoryOverride(max_attempts=1)})
    ckpts = tuple(f"ckpt/step-{n}0.json" for n in range(5, 0, -1))
    moved = [progressing(n, Category.NCCL_ERROR) for n in range(1, 6)]
    assert decide_retry(policy, moved, ckpts).retry  # the fifth nccl_error, but it saved a checkpoint
    stuck = failed(6, Category.NCCL_ERROR, resumed_from="ckpt/step-50.json", newest_checkpoint="ckpt/step-50.json")
    decision = decide_retry(policy, [*moved, stuck], ckpts)
    assert not decision.retry and "budget spent: 1 of 1" in decision.reason and decision.budget == 1


def test_a_corrupted_checkpoint_already_left_out_of_the_list_resumes_from_the_newest_left():
    """Its acknowledgement no longer verifies, so the selection dropped it: the newest remaining is good."""
    last = failed(2, Category.CHECKPOINT_CORRUPTED, resumed_from="ckpt/step-40.json", newest_checkpoint="ckpt/step-40.json")
    decision = decide_retry(RetryPolicy(require_checkpoint_progress=False), [failed(1, Category.PREEMPTED), last], CKPTS)
    assert decision.retry and decision.resume_from == CKPTS[0]


def test_a_stop_on_purpose_is_not_retried_and_not_called_a_failure_that_would_recur():
    decision = decide_retry(RetryPolicy(), [failed(1, Category.USER_CANCELLED, retryable=False)], CKPTS)
    assert not decision.retry
    assert decision.reason == "user_cancelled is not retryable: someone stopped it on purpose"
