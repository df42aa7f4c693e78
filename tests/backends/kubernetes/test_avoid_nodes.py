"""Nodes a Kubernetes attempt is kept off, against kubesim: by the Node's name, only names that can be one,
and never every node.

kubesim validates node affinity as the API server does since 1.32 (kubernetes#128212): a
`matchExpressions` value must be a label value, a `matchFields` requirement holds one value. The
GPUs are kubesim's advertised ones (no GPU exists here).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import within

from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.errors import KubeError
from trainguard.core.backends.kubernetes.manifests import JobSettings

OK = "print('step 1 loss 0.5', flush=True)"


def _backend(kube: KubeApi, ns: str, tmp_path: Path) -> KubernetesBackend:
    return KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                        local_root=str(tmp_path / "local")))


def _run(b: KubernetesBackend, run_id: str, avoid: tuple[str, ...]) -> tuple[Any, list[str]]:
    lines: list[str] = []
    ref = b.provision(run_id, 1)
    launch = Launch(run_id, 1, (sys.executable, "-c", OK), avoid_nodes=avoid, gpus=1)
    return within(120, lambda: b.run(ref, launch, on_line=lines.append), "the attempt"), lines


def _fields(kube: KubeApi, ns: str, run_id: str) -> Any:
    spec = kube.read_job(ns, f"tg-{run_id}-a1")["spec"]["template"]["spec"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    return terms


def test_an_avoided_name_that_is_no_node_is_left_out_and_the_attempt_runs_off_the_real_one(
        kube: KubeApi, ns: str, tmp_path: Path) -> None:
    outcome, _ = _run(_backend(kube, ns, tmp_path), "k-typo", ("gpu-b (ECC, RMA 4411)", "gpu-node-1", "gpu-node-9"))

    assert outcome.succeeded, outcome
    assert outcome.node == "gpu-node-2"
    assert _fields(kube, ns, "k-typo") == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                              "values": ["gpu-node-1"]}]}]


def test_avoiding_every_node_avoids_none_and_says_so(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    outcome, lines = _run(_backend(kube, ns, tmp_path), "k-all", ("gpu-node-1", "gpu-node-2"))

    assert outcome.succeeded, outcome
    assert _fields(kube, ns, "k-all") is None
    assert ("trainguard: not keeping the attempt off gpu-node-1, gpu-node-2: that would leave 0 of the 2 "
            "schedulable nodes, and it needs 1") in lines


def test_a_node_whose_hostname_label_is_not_its_name_is_still_avoided(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    kube.core.patch_node("gpu-node-1", {"metadata": {"labels": {"kubernetes.io/hostname": "ip-10-0-0-1"}}})
    try:
        for n in range(3):  # where avoiding does nothing, one of these lands on it
            outcome, _ = _run(_backend(kube, ns, tmp_path), f"k-label-{n}", ("gpu-node-1",))
            assert outcome.succeeded and outcome.node == "gpu-node-2", outcome
    finally:
        kube.core.patch_node("gpu-node-1", {"metadata": {"labels": {"kubernetes.io/hostname": "gpu-node-1"}}})


def test_the_api_refuses_a_label_value_that_is_no_label_value(kube: KubeApi, ns: str) -> None:
    """kubesim's validation, as 1.32's: what the backend must never send."""
    expression = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-b (ECC, RMA 4411)"]}
    pod = {"metadata": {"name": "bad-affinity"}, "spec": {
        "containers": [{"name": "c", "image": "python:3.11", "command": ["true"]}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}}}
    with pytest.raises(KubeError, match="a valid label must be"):
        kube.create_pod(ns, pod)
