"""kubesim: a Kubernetes API on loopback whose containers are real local processes.

Test infrastructure only: product code never imports it. The public entry points are
`kubesim.run(...)` (a context manager yielding a handle on a running cluster) and the
configuration values re-exported here.
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
