"""Helpers the kubesim tests share: seeding pods, reading logs, kubectl, API object shapes."""

from __future__ import annotations

import json

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import kubesim

KUBECTL = shutil.which("kubectl")
SEEDED = "kubesim-tests-manual"  # a schedulerName no scheduler serves: pods stay where put


class _Raw:
    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body)


def shape(body: Any, klass: str) -> Any:
    """Deserialize with the official client's models: a missing required field fails here."""
    return client.ApiClient().deserialize(_Raw(body), klass)


def seeded_pod(name: str, *, containers: tuple[str, ...] = ("main",),
               labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod no scheduler or kubelet touches, so tests can write its status as a kubelet."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"schedulerName": SEEDED,
                     "containers": [{"name": c, "image": "python:3.11"} for c in containers]}}


def read_log(core: client.CoreV1Api, name: str, namespace: str, **kwargs: Any) -> str:
    """A pod's log as text.

    kubernetes 36 returns the repr of the bytes for text bodies
    (kubernetes-client/python#2596), so the raw body is read, as clients must.
    """
    raw = core.read_namespaced_pod_log(name, namespace, _preload_content=False, **kwargs)
    return raw.data.decode()  # type: ignore[no-any-return]


def kubectl(sim: kubesim.fixture.Sim, *args: str, check: bool = True, timeout: float = 30,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed on this machine")
    done = subprocess.run([KUBECTL, *args], env=sim.env, capture_output=True, text=True,
                          timeout=timeout, input=stdin)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
    return done


def write_cri_log(sim: kubesim.fixture.Sim, pod: dict[str, Any], container: str, restart: int,
                  lines: list[tuple[str, str, str]]) -> Path:
    """Write a container instance's log as the kubelet does: (timestamp, stream, text)."""
    meta = pod["metadata"]
    path = (Path(sim.root) / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
            / container / f"{restart}.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{ts} {stream} F {text}\n" for ts, stream, text in lines))
    return path
