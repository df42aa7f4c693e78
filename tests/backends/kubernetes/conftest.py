"""One kubesim cluster for the Kubernetes adapter tests, a fresh namespace per test.

kubesim's nodes advertise `nvidia.com/gpu`: the GPUs are the only stand-in (no GPU exists on the
test machines); everything else is the real `kubernetes` client over HTTP against a real API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import kubesim
from simfixtures import sim_fixture
import kubesim.fixture
from trainguard.core.backends.kubernetes.api import KubeApi, RetrySettings


sim = sim_fixture(scope="session")


@pytest.fixture(scope="session")
def kube(sim: kubesim.fixture.Sim) -> Iterator[KubeApi]:
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig), retry=RetrySettings(first_delay_seconds=0.01))
    yield api
    api.close()


@pytest.fixture
def ns(kube: KubeApi, sim: kubesim.fixture.Sim) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace({"metadata": {"name": name}})
    yield name
    sim.faults.clear()
