"""Per-test blocks for the flow tests, on the session's one real Prefect server (tests/conftest.py).

Flow tests run real flows against it: real processes, real files, the real triage engine. The only
thing that cannot exist here is a GPU; no test needs one.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

from blocks import EvidenceFolder, LocalProcessBackend
from flow_helpers import ROOT, deployment_exists, prefect_cli, subprocess_env
from services.prefect_server import stop_group
from waiting import wait_for
from prefect import get_client
from s3fixtures import s3, s3_server  # noqa: F401  (fixtures for the S3 evidence tests)


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


SERVED = ("train-attempt/local", "training-run/local", "retry-controller/local")


@pytest.fixture(scope="session")
def serve_session(prefect_server, tmp_path_factory):
    """`python -m deployments.serve` in a subprocess against the test server, for the whole session."""
    tmp_path = tmp_path_factory.mktemp("serve")
    log_path = tmp_path / "serve.log"
    log = log_path.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "deployments.serve"], cwd=ROOT, env=subprocess_env(prefect_server),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for name in SERVED:
            wait_for(lambda: proc.poll() is not None or deployment_exists(name), 120, f"the served deployment {name}")
        yield proc, log_path
    finally:
        if proc.poll() is not None:  # the tests that used it passed; say how it ended all the same
            warnings.warn(f"deployments.serve ended early with {proc.returncode}; its log ends:\n{_tail(log_path)}")
        stop_group(proc)
        log.close()


@pytest.fixture
def served(serve_session):
    """The session's serving process, alive and with its deployments registered, for this test."""
    proc, log_path = serve_session
    assert proc.poll() is None, f"deployments.serve ended with {proc.returncode}; its log ends:\n{_tail(log_path)}"
    return proc


def _tail(log: Path) -> str:
    return log.read_bytes()[-2000:].decode(errors="replace")


DEPLOYMENTS = {"train-attempt/local-pool", "train-attempt/kubernetes", "training-run/nightly-retrain",
               "retry-controller/safety-net", "fleet-report/daily"}


@pytest.fixture(scope="session")
def deployed(prefect_server):
    """prefect.yaml deployed as the README says: both work pools (the Kubernetes one from
    deployments/kubernetes/base-job-template.json), then `prefect deploy --all`."""
    env = subprocess_env(prefect_server)
    prefect_cli(env, "work-pool", "create", "trainguard-local", "--type", "process", "--overwrite")
    prefect_cli(env, "work-pool", "create", "trainguard-kubernetes", "--type", "kubernetes", "--overwrite",
                "--base-job-template", "deployments/kubernetes/base-job-template.json")
    prefect_cli(env, "--no-prompt", "deploy", "--all")
    with get_client(sync_client=True) as client:
        return {name: client.read_deployment_by_name(name) for name in DEPLOYMENTS}
