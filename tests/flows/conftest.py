"""One real Prefect server for every flow test (it takes ~10 s to start), plus run helpers.

Flow tests run real flows against it: real processes, real files, the real triage engine. The only
thing that cannot exist here is a GPU; no test needs one.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.sorting import FlowRunSort
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness

from blocks import EvidenceFolder, LocalProcessBackend
from trainguard.demo import SCRIPT

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_server():
    """A real Prefect API server for the session; yields its URL for subprocesses."""
    with prefect_test_harness(server_startup_timeout=90):
        yield PREFECT_API_URL.value()


@pytest.fixture
def blocks(prefect_server, tmp_path) -> dict[str, Any]:
    """Saved backend and evidence blocks pointing into this test's folder."""
    suffix = uuid.uuid4().hex[:8]
    LocalProcessBackend(work_root=str(tmp_path / "work"), grace_seconds=2).save(f"backend-{suffix}")
    EvidenceFolder(root=str(tmp_path / "evidence")).save(f"evidence-{suffix}")
    return {
        "backend_block": f"backend-{suffix}",
        "evidence_block": f"evidence-{suffix}",
        "work": tmp_path / "work",
        "evidence": tmp_path / "evidence",
    }


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
