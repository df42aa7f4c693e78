"""What every flow-running test folder shares: specs for the tiny trainer and lineage queries.

Flow, Slurm and scale tests run the same tiny trainer (trainguard/demo/train_tiny.py) through
different backends and servers, and look up a run's attempts the same way.
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.sorting import FlowRunSort

from trainguard.demo import SCRIPT


def tiny_spec(name: str, *script_args: str, **fields: Any) -> dict[str, Any]:
    """A spec that runs the tiny trainer with `script_args`, fast steps and no backoff."""
    retry = {"delay_seconds": 0, **fields.pop("retry", {})}
    return {
        "name": name,
        "command": [sys.executable, str(SCRIPT), "--steps", "40", "--step-seconds", "0", *script_args],
        "retry": retry,
        **fields,
    }


def attempt_runs(run_id: str) -> list[Any]:
    """Every train-attempt flow run of `run_id`, oldest first."""
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["train-attempt"])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"trainguard-run:{run_id}"])),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        )


def run_logs(flow_run_id: str) -> list[str]:
    """The messages the Prefect API holds for one flow run (its tasks' included)."""
    from uuid import UUID

    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)])))
    return [entry.message for entry in logs]
