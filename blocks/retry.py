"""The retry policy block: how runs are retried, edited in the Prefect UI and shared by deployments.

A run spec's own `retry` section wins over the block; with neither, the taxonomy's defaults apply.
"""

from __future__ import annotations

from typing import cast

from prefect.blocks.core import Block
from pydantic import Field

from trainguard.core.policy import RetryPolicy as CorePolicy
from trainguard.core.spec import RetrySpec, TrainingSpec


class RetryPolicy(Block):
    """Attempt budget, backoff, circuit breaker and per-category overrides."""

    _block_type_name = "trainguard Retry Policy"
    _block_type_slug = "trainguard-retry-policy"
    _description = "How trainguard retries failed training attempts."

    settings: RetrySpec = Field(
        default_factory=RetrySpec, title="Retry settings",
        description="Attempts, backoff (fixed or exponential), the circuit breaker and per-category overrides; "
        "a run spec's own retry section wins over these.",
    )

    def policy(self) -> CorePolicy:
        return self.settings.to_policy()


def resolve_policy(spec: TrainingSpec, block_name: str | None) -> CorePolicy:
    """The policy for a run: its spec's retry section, else the named block, else the defaults."""
    if spec.retry is not None:
        return spec.retry.to_policy()
    if block_name:
        return cast(RetryPolicy, RetryPolicy.load(block_name)).policy()
    return RetrySpec().to_policy()
