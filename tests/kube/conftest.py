"""One kubesim cluster for the Kubernetes adapter tests, a fresh namespace per test.

kubesim's nodes advertise `nvidia.com/gpu`: the GPUs are the only stand-in (no GPU exists on the
test machines); everything else is the real `kubernetes` client over HTTP against a real API.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest

import kubesim
import kubesim.fixture
from trainguard.core.backends.kubernetes.api import KubeApi, RetrySettings


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubesim.fixture.Sim]:
    with kubesim.run(
        root=tmp_path_factory.mktemp("kubesim"),
        nodes=[kubesim.Node("gpu-node-1", gpus=2, cpu="8", memory="16Gi"),
               kubesim.Node("gpu-node-2", gpus=2, cpu="8", memory="16Gi")],
        images={"python:*": kubesim.HostPython(sys.executable),
                "ghcr.io/acme/train:*": kubesim.HostPython(sys.executable)},
        time_scale=0.02,
    ) as running:
        yield running


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
