"""`kubectl apply -k` of what the project ships for a cluster, against kubesim: every kind is
accepted, lands in the namespace the Kubernetes quickstart uses, and a second apply changes nothing.
Also kubesim's image WORKDIR: a container without a workingDir starts where its image says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import kubectl
from kubernetes import client, config
from simfixtures import sim_fixture
from waiting import wait_for

import kubesim

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image's WORKDIR holding a script."""
    folder = tmp_path_factory.mktemp("image-workdir")
    (folder / "train.py").write_text("import os\nprint('ran in', os.getcwd(), flush=True)\n")
    return folder


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, code: Path) -> Any:
    images = {"acme/code:*": kubesim.HostPython(sys.executable, workdir=str(code)),
              "python:*": kubesim.HostPython(sys.executable)}
    with kubesim.run(root=tmp_path_factory.mktemp("kubesim"), images=images, time_scale=0.02) as running:
        yield running


def _names(sim: Any, kind: str, namespace: str | None = None) -> list[str]:
    args = ["get", kind, "-o", "name"] + (["-n", namespace] if namespace else [])
    return sorted(kubectl(sim, *args).stdout.split())


def test_apply_k_creates_every_object_then_leaves_them_unchanged(sim: Any) -> None:
    first = kubectl(sim, "apply", "-k", str(ROOT / "deployments" / "kubernetes")).stdout
    assert "namespace/trainguard created" in first
    assert _names(sim, "pvc", "trainguard") == ["persistentvolumeclaim/trainguard-attempts",
                                                "persistentvolumeclaim/trainguard-checkpoints"]
    assert {"serviceaccount/trainguard", "serviceaccount/prefect-worker"} <= set(_names(sim, "sa", "trainguard"))
    assert _names(sim, "roles", "trainguard") == ["role.rbac.authorization.k8s.io/prefect-worker",
                                                  "role.rbac.authorization.k8s.io/trainguard"]
    assert _names(sim, "rolebindings", "default") == ["rolebinding.rbac.authorization.k8s.io/trainguard-node-events"]
    assert "clusterrole.rbac.authorization.k8s.io/trainguard-nodes" in _names(sim, "clusterroles")
    modes = kubectl(sim, "get", "pvc", "-n", "trainguard", "-o",
                    "jsonpath={.items[*].spec.accessModes[0]}").stdout.split()
    assert modes == ["ReadWriteOnce", "ReadWriteOnce"]
    again = kubectl(sim, "apply", "-k", str(ROOT / "deployments" / "kubernetes")).stdout.splitlines()
    assert again and all(line.endswith(" unchanged") for line in again), again


def test_the_multi_node_variant_asks_readwritemany_of_both_claims() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(ROOT / "deployments" / "kubernetes-multi-node")],
                           check=True, capture_output=True, text=True).stdout
    claims = [doc for doc in built.split("\n---\n") if "kind: PersistentVolumeClaim" in doc]
    assert len(claims) == 2 and all("- ReadWriteMany" in c and "ReadWriteOnce" not in c for c in claims)


def _pod(name: str, image: str, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": image, "command": ["python", "train.py"], **container}]}}


def test_a_relative_command_path_resolves_against_the_image_workdir(sim: Any, code: Path,
                                                                     tmp_path: Path) -> None:
    core = client.CoreV1Api(config.new_client_from_config(str(sim.kubeconfig)))
    core.create_namespaced_pod("default", _pod("wd", "acme/code:1"))
    # a container's own workingDir wins over the image's, as on a real runtime
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "train.py").write_text("print('the container workingDir', flush=True)\n")
    core.create_namespaced_pod("default", _pod("own", "acme/code:1", workingDir=str(other)))
    # an image without a WORKDIR starts in a folder of the container's own: no train.py there
    core.create_namespaced_pod("default", _pod("none", "python:3.11"))
    for name, phase in (("wd", "Succeeded"), ("own", "Succeeded"), ("none", "Failed")):
        wait_for(lambda n=name, p=phase: core.read_namespaced_pod(n, "default").status.phase == p,
                 timeout=60, what=f"pod {name} {phase}")
    assert kubectl(sim, "logs", "wd").stdout == f"ran in {code}\n"
    assert kubectl(sim, "logs", "own").stdout == "the container workingDir\n"
    assert "No such file or directory" in kubectl(sim, "logs", "none").stdout

