"""The services the backend tests share, each started once per session when a selected test needs it.

kubesim (`sim`, `kube`, a fresh namespace per test as `ns`): its nodes advertise `nvidia.com/gpu`,
the GPUs are the only stand-in (no GPU exists on the test machines); everything else is the real
`kubernetes` client over HTTP against a real API.

A real single-node Slurm (`slurm_cluster`, `slurm_node_up`; tests/services/slurm_cluster.py) runs
MariaDB, munged, slurmdbd, slurmctld and slurmd on loopback from a throwaway folder; `./dev test`
installs their OS packages. It starts in the background as soon as collection shows a selected test
will use it, so its ~10 s of start-up overlap the Prefect server's (tests/conftest.py) and earlier
tests. Nothing here is mocked: jobs are real sbatch jobs.

Both are here, above the backends' own folders, so the backend contract (test_backend_contract.py)
runs every backend on the same services as each backend's own tests.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import kubesim
import kubesim.fixture
from services.slurm_cluster import SlurmCluster, missing_binaries
from simfixtures import sim_fixture
from trainguard.core.backends.kubernetes.api import KubeApi, RetrySettings
from waiting import wait_for


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


class _Starting:
    """The session's cluster, started in a thread; `ready()` waits for it and re-raises its failure."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="trainguard-slurm-"))
        self.cluster = SlurmCluster(self.root)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="slurm-cluster-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.cluster.start()
            wait_for(lambda: self.cluster.node_state() == "idle", timeout=90, what="the Slurm node to be idle",
                     interval=0.1)
        except BaseException as exc:  # handed to the first test that needs the cluster
            self.error = exc

    def ready(self) -> SlurmCluster:
        self._thread.join(180)
        if self._thread.is_alive():
            raise RuntimeError("the Slurm test cluster did not start within 180s")
        if self.error is not None:
            raise self.error
        return self.cluster

    def stop(self) -> None:
        self._thread.join(180)
        self.cluster.stop()
        shutil.rmtree(self.root, ignore_errors=True)


_starting: _Starting | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the cluster now if a selected test needs it (Slurm's unit tests do not) and Slurm is installed.

    Under pytest-xdist every worker collects every test, but not every worker runs the tests that use
    it (see tests/conftest.py): there the cluster starts when the first of them is set up.
    """
    global _starting
    if hasattr(session.config, "workerinput"):
        return
    if _starting is None and not missing_binaries() and any("slurm_cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        _starting = _Starting()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """On an xdist worker, start the cluster in the background when its first test that uses it is set up.

    The test's other fixtures (the Prefect server's ~10 s, more on a loaded machine) are set up while the
    cluster starts, instead of before it: the fixture itself then only waits for what is left.
    """
    global _starting
    if _starting is None and "slurm_cluster" in getattr(item, "fixturenames", ()) and not missing_binaries():
        _starting = _Starting()


def pytest_sessionfinish(session: pytest.Session) -> None:
    global _starting
    if _starting is not None:
        _starting.stop()
        _starting = None


@pytest.fixture(scope="session")
def slurm_cluster():
    """munged, slurmctld, slurmd and accounting for the session; the node is idle when this yields."""
    missing = missing_binaries()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): run ./dev test, which installs "
                    "slurm-wlm, munge, slurmdbd, slurm-wlm-mysql-plugin and mariadb-server-core")
    global _starting
    if _starting is None:  # an xdist worker: this is the worker that runs the Slurm tests
        _starting = _Starting()
    return _starting.ready()


def _resume_if_set_down(cluster: SlurmCluster) -> None:
    if cluster.node_state().startswith(("down", "drain")):  # a test set it so; busy states pass by themselves
        cluster.set_node("resume")


@pytest.fixture
def slurm_node_up(slurm_cluster):
    """The node is idle before the test and brought back after it, whatever the test did to it."""
    _resume_if_set_down(slurm_cluster)
    wait_for(lambda: slurm_cluster.node_state() == "idle", timeout=60, interval=0.2,
             what=lambda: f"the Slurm node to be idle (it is {slurm_cluster.node_state()!r})")
    yield slurm_cluster
    _resume_if_set_down(slurm_cluster)


