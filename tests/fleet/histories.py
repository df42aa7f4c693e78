"""Generated verdict histories for the fleet tests: a fleet of nodes, each attempt a real `AttemptSummary`.

Seeded, so every run of a test sees the same history. The baseline hardware failure rate is that of a
healthy fleet (a few percent of attempts); a planted node fails far more often.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from trainguard.core.attempt import AttemptSummary
from trainguard.core.policy import RetryDecision

START = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
HARDWARE = ("gpu_fault", "node_failure", "nccl_error")
SOFTWARE = ("code_error", "cuda_oom", "data_error")


def attempt(run: str, number: int, node: str, category: str | None, fingerprint: str = "",
            signature: str = "", **changes: object) -> AttemptSummary:
    """One attempt's verdict: failed with ``category``, or succeeded when it is None."""
    failed = category is not None
    fields: dict[str, object] = dict(
        run_id=run, attempt=number, max_attempts=3, state="Failed" if failed else "Completed", category=category,
        rule_id=f"{category}-rule" if failed else None, fingerprint=fingerprint if failed else "",
        signature=(signature or f"{category} on {node}") if failed else None, node=node, gpus=8,
        duration_seconds=1800.0, decision=RetryDecision(retry=failed, reason="-"))
    return AttemptSummary(**{**fields, **changes})  # type: ignore[arg-type]


def fleet(nodes: int = 50, attempts_per_node: int = 40, bad: str | None = "gpu-07", bad_rate: float = 0.4,
          rate: float = 0.04, seed: int = 7) -> Iterator[tuple[AttemptSummary, datetime]]:
    """(verdict, when) for every attempt of a fleet over 10 days; ``bad`` fails on hardware at ``bad_rate``."""
    chance = random.Random(seed)
    for n in range(nodes):
        node = f"gpu-{n:02d}"
        for k in range(attempts_per_node):
            hardware = chance.random() < (bad_rate if node == bad else rate)
            software = not hardware and chance.random() < 0.05
            category = chance.choice(HARDWARE) if hardware else chance.choice(SOFTWARE) if software else None
            when = START + timedelta(minutes=chance.randrange(10 * 24 * 60))
            yield attempt(f"run-{n:02d}-{k:03d}", 1, node, category, fingerprint=f"fp-{category}-{n}-{k}"), when
