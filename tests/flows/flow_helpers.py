"""Helpers shared by the flow tests: specs for the tiny trainer, lineage queries, waiting."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound

from trainguard.demo import SCRIPT

ROOT = Path(__file__).resolve().parents[2]


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


def attempt_dir(evidence_root: Path, run_id: str, attempt: int) -> Path:
    return evidence_root / "runs" / run_id / f"attempt-{attempt}"


def subprocess_env(api_url: str) -> dict[str, str]:
    """The environment of a Prefect process the tests start against the test server."""
    return {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PYTHONPATH": str(ROOT),
    }


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def read_run(flow_run_id: Any) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def deployment_exists(name: str) -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
            return True
        except ObjectNotFound:
            return False
