"""One real Prefect server for every flow test (it takes ~10 s to start), and per-test blocks.

Flow tests run real flows against it: real processes, real files, the real triage engine. The only
thing that cannot exist here is a GPU; no test needs one.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness

from blocks import EvidenceFolder, LocalProcessBackend
from s3fixtures import s3, s3_server  # noqa: F401  (fixtures for the S3 evidence tests)

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
        "backend_block": f"trainguard-local-process-backend/backend-{suffix}",
        "evidence_block": f"evidence-{suffix}",
        "work": tmp_path / "work",
        "evidence": tmp_path / "evidence",
    }
