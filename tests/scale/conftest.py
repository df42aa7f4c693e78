"""A PostgreSQL-backed Prefect server for the scale tests, shared by the session, and its work pool.

PostgreSQL is a throwaway cluster in a temporary folder on a loopback port; the Prefect server is a
real `prefect server start` subprocess against it. Both are stopped and removed after the session.
The test process itself talks to the server directly; workers and flow runs may go through a
fault-injecting proxy (`services.faulty_proxy`).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, temporary_settings

from scale_helpers import POOL, ROOT
from services.postgres import postgres_cluster
from services.prefect_server import PREFECT, prefect_server, quiet_env

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def postgres():
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pg_server(postgres):
    """A Prefect server on the PostgreSQL cluster, with its UI (the screenshot test photographs it)."""
    with prefect_server(postgres.url(), ui=True) as server:
        yield server


@pytest.fixture(autouse=True)
def pg_client(pg_server):
    """Point this folder's tests (only these: other folders use their own server) at `pg_server`."""
    with temporary_settings({PREFECT_API_URL: pg_server.api_url}):
        yield
    # Prefect keeps one events (and log) worker per process, bound to the server it first sent to:
    # stop them, so the tests that run next in this process send to their own server again.
    EventsWorker.drain_all(timeout=10)


def prefect_cli(api_url: str, *args: str, timeout: float = 120) -> str:
    """Run the `prefect` command against `api_url` from the project root; fail with its output."""
    done = subprocess.run([PREFECT, "--no-prompt", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=quiet_env(api_url, TRAINGUARD_PROJECT_DIR=str(ROOT)))
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def attempt_deployment(pg_server) -> str:
    """prefect.yaml's `train-attempt/local-pool` deployment on its process work pool, as a user deploys it."""
    prefect_cli(pg_server.api_url, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    prefect_cli(pg_server.api_url, "deploy", "--name", "local-pool")
    return "train-attempt/local-pool"
