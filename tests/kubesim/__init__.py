"""kubesim: a Kubernetes API on loopback whose containers are real local processes.

Test infrastructure only: product code never imports it. The public entry points are
`kubesim.run(...)` (a context manager yielding a handle on a running cluster) and the
configuration values re-exported here::

    with kubesim.run(root=tmp_path,
                     nodes=[kubesim.Node("gpu-node-1", gpus=2)],
                     images={"ghcr.io/acme/train:*": kubesim.HostPython(sys.executable)},
                     time_scale=0.05) as sim:
        api = kubernetes.config.new_client_from_config(str(sim.kubeconfig))
        sim.faults.add(verb="list", resource="pods", status=503, times=1)
        sim.oom_kill("default", "train-x7k2p")          # 137 / OOMKilled
        sim.evict("default", "train-x7k2p")            # node-pressure eviction
        sim.node("gpu-node-1").partition()             # NotReady, taints; .heal(), .crash()
        sim.outage(2.0)                                # connections refused for 2 s
        sim.requests(verb="get", name="train-x7k2p")   # the request log

Multi-node attempts: give as many nodes as pods (`nodes=[kubesim.Node("node-1"),
kubesim.Node("node-2")]`). Every pod gets its own 127.x.y.z IP, and when Debian's libnss-wrapper
is installed its processes resolve cluster DNS names (headless Services and
`<hostname>.<subdomain>` of their pods) through a hosts file kubesim keeps current; nodes carry
a PodDNSUnavailable warning event otherwise. Indexed Jobs, Services and Kubeflow PyTorchJobs
(kubeflow.org/v1) are served and controlled as on a cluster.

By hand: `PYTHONPATH=tests python -m kubesim serve --port 0 --kubeconfig OUT --root DIR`.
Limits: no protobuf bodies (kubectl's imperative `create configmap/secret` generators send
them), no OpenAPI schemas (`kubectl explain`), server-side apply is a strategic merge.
"""

from __future__ import annotations

from typing import Any

from kubesim.config import Host, HostPython, NodeSpec, SimConfig

Node = NodeSpec

__all__ = ["Host", "HostPython", "Node", "NodeSpec", "SimConfig", "run"]


def run(*args: Any, **kwargs: Any) -> Any:
    """Start a cluster in a subprocess; see kubesim.fixture.run."""
    from kubesim import fixture  # the fixture pulls in subprocess handling only when used

    return fixture.run(*args, **kwargs)
