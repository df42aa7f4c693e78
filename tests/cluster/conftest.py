"""Fixtures for kubesim's own tests: one cluster per session, a fresh namespace per test.

The cluster runs with a small time_scale so back-offs and grace periods take milliseconds;
tests isolate themselves by namespace instead of restarting the server.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client, config

import kubesim
from simfixtures import sim_fixture



sim = sim_fixture(scope="session", nodes=(kubesim.Node("node-1", gpus=2, cpu="8", memory="16Gi"),
                                           kubesim.Node("node-2", cpu="8", memory="16Gi")))


@pytest.fixture(scope="session")
def api_client(sim: kubesim.fixture.Sim) -> client.ApiClient:
    return config.new_client_from_config(str(sim.kubeconfig))


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def batch(api_client: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api_client)


@pytest.fixture
def ns(core: client.CoreV1Api) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    return name
