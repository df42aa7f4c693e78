"""Shared pieces of the Kubernetes flow tests: one kubesim per module, blocks per test, specs.

kubesim's nodes advertise `nvidia.com/gpu`, the only stand-in these tests use: no GPU exists on
the test machines. Everything else is real: the `kubernetes` client over HTTP, Jobs, pods, logs,
events, OOM kills and evictions, the Prefect server, the flows.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import kubesim
import kubesim.fixture
from blocks import EvidenceFolder, KubernetesJobBackend
from runs import run_logs  # noqa: F401  (the Kubernetes flow tests read their run logs through here)
from trainguard.demo import SCRIPT

GPU_FAULT = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."


def kube_blocks(sim: kubesim.fixture.Sim, tmp_path: Path, **fields: Any) -> dict[str, Any]:
    """A fresh namespace, a saved Kubernetes backend block for it and an evidence folder."""
    suffix = uuid.uuid4().hex[:8]
    namespace = f"t-{suffix}"
    from trainguard.core.backends.kubernetes.api import KubeApi

    api = KubeApi.from_kubeconfig(str(sim.kubeconfig))
    api.core.create_namespace({"metadata": {"name": namespace}})
    settings = {"kubeconfig_path": str(sim.kubeconfig), "namespace": namespace, "image": "python:3.11",
                "local_root": str(tmp_path / "local"), "failed_job_ttl_seconds": 600, **fields}
    KubernetesJobBackend(**settings).save(f"kube-{suffix}")
    EvidenceFolder(root=str(tmp_path / "evidence")).save(f"evidence-{suffix}")
    return {"backend_block": f"trainguard-kubernetes-job-backend/kube-{suffix}", "evidence_block": f"evidence-{suffix}",
            "evidence": tmp_path / "evidence", "namespace": namespace, "api": api}


def tiny(name: str, *args: str, **fields: Any) -> dict[str, Any]:
    """A spec running the demo trainer (a real CPU training loop) in the Job."""
    retry = {"delay_seconds": 0, **fields.pop("retry", {})}
    return {"name": name, "command": ["python", str(SCRIPT), "--steps", "30", "--step-seconds", "0", *args],
            "retry": retry, "gpus": 1, **fields}


def inline(name: str, code: str, **fields: Any) -> dict[str, Any]:
    retry = {"delay_seconds": 0, **fields.pop("retry", {})}
    return {"name": name, "command": ["python", "-c", code], "retry": retry, "gpus": 1, **fields}


def kept(evidence: Path, run_id: str, attempt: int, name: str) -> Any:
    """An item of the attempt's evidence: JSON decoded, else text."""
    path = evidence / "runs" / run_id / f"attempt-{attempt}" / name
    text = path.read_text(errors="replace")
    return json.loads(text) if name.endswith(".json") else text


def evidence_names(evidence: Path, run_id: str, attempt: int) -> list[str]:
    root = evidence / "runs" / run_id / f"attempt-{attempt}"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def pod_of(api: Any, namespace: str, run_id: str, attempt: int, phase: str = "Running") -> str | None:
    """The attempt's pod name once it is in `phase` (for faults injected from outside)."""
    from trainguard.core.backends.kubernetes import manifests

    for pod in api.list_pods(namespace, manifests.selector(run_id, attempt))["items"]:
        if pod["status"].get("phase") == phase:
            return str(pod["metadata"]["name"])
    return None
