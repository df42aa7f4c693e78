"""kubesim for the tests: one fixture factory, so every test module gets its cluster the same way.

``sim = sim_fixture()`` in a module (or a conftest) gives it a running kubesim (tests/kubesim) with
two GPU nodes whose containers run on this host's Python; ``scope``, ``nodes`` and more ``images``
change that where a test needs another cluster. The cluster stops, and every container it started
ends, when the fixture's scope does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

import kubesim
import kubesim.fixture

GPU_NODES = (kubesim.Node("gpu-node-1", gpus=2, cpu="8", memory="16Gi"),
             kubesim.Node("gpu-node-2", gpus=2, cpu="8", memory="16Gi"))
HOST_PYTHON = {"python:*": kubesim.HostPython(sys.executable),
               "ghcr.io/acme/train:*": kubesim.HostPython(sys.executable)}
TIME_SCALE = 0.02  # kubelet and controller delays (back-offs, grace periods) at 1/50


def sim_fixture(scope: str = "module", nodes: Sequence[kubesim.Node] = GPU_NODES,
                images: Mapping[str, Any] | None = None,
                grace_scale: float | None = None) -> Callable[..., Iterator[kubesim.fixture.Sim]]:
    """A pytest fixture that runs one kubesim for ``scope``.

    Args:
        scope: The pytest scope ("module" for a file's own cluster, "session" for a folder's).
        nodes: The cluster's nodes.
        images: More image patterns and the runtime each maps to, beside the host-Python ones.
        grace_scale: The pods' grace periods' scale (1.0: real seconds), where not TIME_SCALE's.
    """

    @pytest.fixture(scope=scope)  # type: ignore[misc]
    def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubesim.fixture.Sim]:
        with kubesim.run(root=tmp_path_factory.mktemp("kubesim"), nodes=list(nodes),
                         images={**HOST_PYTHON, **(images or {})}, time_scale=TIME_SCALE,
                         grace_scale=grace_scale) as running:
            yield running

    return sim
