"""Which nodes fail on hardware well above the fleet: a rule a small sample cannot trigger.

A node is a suspect when all of these hold:

1. hardware-class failures (``gpu_fault``, ``node_failure``, ``nccl_error``) were placed on it as
   the culprit in at least `SuspectRule.min_failures` distinct runs: a failure is counted once per
   run, so one run retried again and again, printing an NCCL or Xid line wherever it lands (its
   own bug, or its own data), cannot make a node a suspect alone;
2. its rate of them (runs failing there per attempt there) is at least `SuspectRule.min_ratio`
   times the rest of the fleet's, counted the same way;
3. a one-sided binomial test says so: the chance of that many or more such failures in its
   attempts, were its rate the rest of the fleet's, is at most `SuspectRule.alpha` divided by the
   number of nodes tested (Bonferroni: with fifty nodes, one of them looks bad by luck often).

The rest of the fleet's rate leaves the node out (a bad node must not raise the bar it is judged
by) and adds one failure and two attempts (Laplace's rule), so a fleet with no other failure does
not make a single one significant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HARDWARE = frozenset({"gpu_fault", "node_failure", "nccl_error"})
_NEGLIGIBLE = 40.0  # log-space distance below the largest term at which the tail sum stops


@dataclass(frozen=True)
class SuspectRule:
    """The thresholds of the rule above (the defaults are what `trainguard fleet` uses)."""

    min_failures: int = 3
    min_ratio: float = 2.0
    alpha: float = 0.01


@dataclass(frozen=True)
class NodeTest:
    """One node's test: its counts, the rate it is judged against, and the outcome."""

    attempts: int
    failures: int
    rate: float
    fleet_rate: float
    p_value: float
    threshold: float
    suspect: bool


def fleet_rate(failures: int, attempts: int) -> float:
    """The rest of the fleet's rate, with one failure and two attempts added (never 0 or 1)."""
    return (failures + 1) / (attempts + 2)


def binomial_tail(failures: int, attempts: int, rate: float) -> float:
    """P(X >= failures) for X ~ Binomial(attempts, rate), summed in log space (no overflow).

    Past the distribution's mode the terms only fall, so the sum stops once a term is below e^-40
    of the largest: what is left changes the result by less than ``attempts`` times 4e-18 of it.
    """
    if failures <= 0:
        return 1.0
    if failures > attempts:
        return 0.0
    log_p, log_q = math.log(rate), math.log1p(-rate)
    base, mode = math.lgamma(attempts + 1), attempts * rate
    terms: list[float] = []
    top = -math.inf
    for i in range(failures, attempts + 1):
        term = base - math.lgamma(i + 1) - math.lgamma(attempts - i + 1) + i * log_p + (attempts - i) * log_q
        terms.append(term)
        top = max(top, term)
        if i > mode and term < top - _NEGLIGIBLE:
            break
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def judge(failures: int, attempts: int, rest_failures: int, rest_attempts: int, nodes_tested: int,
         rule: SuspectRule) -> NodeTest:
    """Judge one node against the rest of the fleet (see the module docstring)."""
    rate = failures / attempts if attempts else 0.0
    against = fleet_rate(rest_failures, rest_attempts)
    p_value = binomial_tail(failures, attempts, against)
    threshold = rule.alpha / max(1, nodes_tested)
    suspect = failures >= rule.min_failures and rate >= rule.min_ratio * against and p_value <= threshold
    return NodeTest(attempts, failures, rate, against, p_value, threshold, suspect)
