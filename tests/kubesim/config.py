"""The simulated cluster's configuration: nodes, image runtimes, clock scale.

A frozen, JSON-serialisable value: the fixture writes it to a file and the server subprocess
reads it back. How nodes or images behave belongs to the node side, not here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node: its capacity, labels and taints."""

    name: str
    gpus: int = 0
    cpu: str = "16"
    memory: str = "64Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    # Each taint as the API spells it: {"key": ..., "value": ..., "effect": "NoSchedule"}.
    taints: tuple[Mapping[str, str], ...] = ()


@dataclass(frozen=True)
class HostPython:
    """Run the container's command with this interpreter standing in for python/python3.

    `workdir` is the image's WORKDIR: where a container without a `workingDir` of its own
    starts, so relative paths in its command resolve there (an image whose WORKDIR holds the
    training code). Empty: a folder of the container's own, as for an image without WORKDIR.
    """

    executable: str
    workdir: str = ""


@dataclass(frozen=True)
class Host:
    """Run the container's command on the host as it is (`workdir` as for HostPython)."""

    workdir: str = ""


ImageRuntime = HostPython | Host


@dataclass(frozen=True)
class SimConfig:
    """Everything the server process needs to build the cluster."""

    root: Path
    nodes: tuple[NodeSpec, ...] = (NodeSpec("node-1"),)
    # Image glob -> runtime; empty means every image runs on the host as it is.
    images: Mapping[str, ImageRuntime] = field(default_factory=dict)
    time_scale: float = 1.0
    history: int = 10000
    # Pods' termination grace periods run at this scale (default: time_scale). 1.0 keeps them real,
    # as a test needs whose training reads the grace's end from a notice and saves before it.
    grace_scale: float | None = None

    def __post_init__(self) -> None:
        for node in self.nodes:
            if not isinstance(node, NodeSpec):
                raise ValueError(f"nodes: {node!r} is not a NodeSpec; use kubesim.Node(name, "
                                 "gpus=...)")
        if len({n.name for n in self.nodes}) != len(self.nodes):
            raise ValueError("nodes: node names must be unique")
        for glob, runtime in self.images.items():
            if not isinstance(runtime, (HostPython, Host)):
                raise ValueError(f"images[{glob!r}]: {runtime!r} is not a runtime; use "
                                 "kubesim.HostPython(sys.executable) or kubesim.Host()")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale: {self.time_scale!r} must be a number above 0, "
                             "e.g. 0.05")
        if self.grace_scale is not None and not self.grace_scale > 0:
            raise ValueError(f"grace_scale: {self.grace_scale!r} must be a number above 0, e.g. 1.0")
        if self.history < 1:
            raise ValueError(f"history: {self.history!r} must be at least 1")

    def to_json(self) -> str:
        """Serialise for the server subprocess."""
        return json.dumps({
            "root": str(self.root),
            "nodes": [{"name": n.name, "gpus": n.gpus, "cpu": n.cpu, "memory": n.memory,
                       "labels": dict(n.labels), "taints": [dict(t) for t in n.taints]}
                      for n in self.nodes],
            "images": {glob: _runtime_json(rt) for glob, rt in self.images.items()},
            "time_scale": self.time_scale,
            "history": self.history,
            "grace_scale": self.grace_scale,
        })

    @classmethod
    def from_json(cls, text: str) -> SimConfig:
        """The inverse of to_json."""
        raw = json.loads(text)
        return cls(
            root=Path(raw["root"]),
            nodes=tuple(NodeSpec(n["name"], n["gpus"], n["cpu"], n["memory"], n["labels"],
                                 tuple(n["taints"])) for n in raw["nodes"]),
            images={glob: _runtime_from(rt) for glob, rt in raw["images"].items()},
            time_scale=raw["time_scale"],
            history=raw["history"],
            grace_scale=raw.get("grace_scale"),
        )


def _runtime_json(runtime: ImageRuntime) -> dict[str, Any]:
    if isinstance(runtime, HostPython):
        return {"kind": "HostPython", "executable": runtime.executable, "workdir": runtime.workdir}
    return {"kind": "Host", "workdir": runtime.workdir}


def _runtime_from(raw: dict[str, Any]) -> ImageRuntime:
    if raw["kind"] == "HostPython":
        return HostPython(raw["executable"], raw.get("workdir", ""))
    if raw["kind"] == "Host":
        return Host(raw.get("workdir", ""))
    raise ValueError(f"images: unknown runtime kind {raw['kind']!r}; use HostPython or Host")
