"""Real torch.distributed (gloo) across the pods of an Indexed Job, found through pod DNS.

The product's multi-node attempt: a 2-completion Indexed Job (one pod per node by required
anti-affinity, hold mode `backoffLimitPerIndex: 0`) behind a headless Service, each pod running
`torchrun --nnodes 2 --nproc-per-node 2 --node-rank $(JOB_COMPLETION_INDEX)` with the master at
`<job>-0.<service>`: real processes, real c10d rendezvous over TCP between pod IPs, a real
all_reduce. Oracles: torchrun's documented static rendezvous (every rank sees world size 4 and
the sum of all ranks), the Job's documented conditions, and torch's own failure texts
(ChildFailedError's "Root Cause", gloo's lost-peer errors).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from kubernetes import client
from waiting import wait_for

TRAIN = """\
import datetime, os, socket, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
# one write per line: two ranks share the pod's stdout, and print's text and newline are two writes
# when Python runs unbuffered (PYTHONUNBUFFERED), which can interleave as "A" "B" "\\n" "\\n"
sys.stdout.write(f"rank {rank}/{world} on {socket.gethostname()} all_reduce ok sum {total.item():g}\\n")
sys.stdout.flush()
if rank == int(os.environ.get("FAILING_RANK", "-1")):
    raise RuntimeError(f"rank {rank} lost its data shard")
dist.all_reduce(total)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET6) as probe:  # c10d's store listens on every address
        probe.bind(("::", 0))
        return int(probe.getsockname()[1])


def _attempt(name: str, script: Path, port: int, failing_rank: int = -1) -> dict[str, Any]:
    command = ["python", "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "2", "--node-rank", "$(JOB_COMPLETION_INDEX)",
               "--master-addr", f"{name}-0.{name}", "--master-port", str(port), str(script)]
    one_per_node = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"attempt": name}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    return {"metadata": {"name": name}, "spec": {
        "completionMode": "Indexed", "completions": 2, "parallelism": 2,
        "backoffLimitPerIndex": 0, "template": {
            "metadata": {"labels": {"attempt": name}},
            "spec": {"restartPolicy": "Never", "subdomain": name, "affinity": one_per_node,
                     "terminationGracePeriodSeconds": 5, "containers": [{
                         "name": "train", "image": "python:3.11", "command": command,
                         "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                                 {"name": "FAILING_RANK", "value": str(failing_rank)}]}]}}}}


def _headless(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "clusterIP": "None", "selector": {"attempt": name}, "publishNotReadyAddresses": True}}


def _status(batch: client.BatchV1Api, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(batch.read_namespaced_job_status(
        name, ns, _preload_content=False).data)["status"])


def _condition(batch: client.BatchV1Api, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    return next((c for c in _status(batch, ns, name).get("conditions") or []
                 if c["type"] == ctype and c["status"] == "True"), None)


def _pods(core: client.CoreV1Api, ns: str, name: str) -> dict[int, client.V1Pod]:
    return {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p
            for p in core.list_namespaced_pod(ns, label_selector=f"attempt={name}").items}


def _log(core: client.CoreV1Api, ns: str, pod: client.V1Pod) -> str:
    return str(core.read_namespaced_pod_log(pod.metadata.name, ns,
                                            _preload_content=False).data.decode())


def test_two_pods_of_an_indexed_job_rendezvous_and_all_reduce_over_gloo(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    core.create_namespaced_service(ns, _headless("ddp"))
    batch.create_namespaced_job(ns, _attempt("ddp", script, _free_port()))
    complete = wait_for(lambda: _condition(batch, ns, "ddp", "Complete"), timeout=90,
                        interval=0.2, what="the attempt Complete")
    assert complete["reason"] == "CompletionsReached"
    assert _status(batch, ns, "ddp")["completedIndexes"] == "0,1"
    pods = _pods(core, ns, "ddp")
    assert {p.spec.node_name for p in pods.values()} == {"node-1", "node-2"}
    for index, pod in pods.items():
        lines = [line for line in _log(core, ns, pod).splitlines() if "all_reduce ok" in line]
        ranks = sorted(int(line.split()[1].split("/")[0]) for line in lines)
        assert ranks == [2 * index, 2 * index + 1]
        assert all(f"/4 on ddp-{index} all_reduce ok sum 6" in line for line in lines)


def test_a_raising_rank_fails_its_index_and_hold_mode_keeps_every_pods_log(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    core.create_namespaced_service(ns, _headless("lost"))
    batch.create_namespaced_job(ns, _attempt("lost", script, _free_port(), failing_rank=3))
    wait_for(lambda: "1" in _status(batch, ns, "lost").get("failedIndexes", "").split(","),
             timeout=90, interval=0.2, what="index 1 failed")
    failed = wait_for(lambda: _condition(batch, ns, "lost", "Failed"), timeout=90,
                      interval=0.2, what="the attempt Failed")
    assert (failed["reason"], failed["message"]) == ("FailedIndexes", "Job has failed indexes")
    pods = _pods(core, ns, "lost")
    raised = _log(core, ns, pods[1])
    assert "RuntimeError: rank 3 lost its data shard" in raised and "Root Cause" in raised
    survivor = _log(core, ns, pods[0])
    assert "rank 0/4 on lost-0 all_reduce ok sum 6" in survivor
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=lost").items
    assert "SuccessfulDelete" not in {e.reason for e in events}  # nothing was killed for it
    ended = pods[0].status.container_statuses[0].state.terminated
    assert ended is not None and ended.exit_code == 1  # it failed by itself, not by SIGTERM
