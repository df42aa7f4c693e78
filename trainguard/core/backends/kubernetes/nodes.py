"""The nodes of a multi-node Kubernetes attempt as collection keeps them: one pod per node rank.

``attempt.json`` (`map_attempt`) maps each node rank (the pod's completion index) to its pod, node,
global ranks, exit code, termination reason, first-error time and its evidence items, with a pod
already gone recorded as absent and why; and the files triage reads of each node (its log,
torchrun's error files, its ranks' stacks, its environment snapshot, masked as stored) are kept on
the flow's machine beside the triage facts (`keep_nodes`), in the attempt folder's own layout
(node 0 in the folder itself, node N in ``tasks/N``). Reading them back for triage is ``kept``'s;
which items are collected is ``evidence``'s.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainguard.core import masking
from trainguard.core.backends.workspace import KEPT_NODE_MAP, KEPT_PODS, KEPT_VOLUME, NODE_FOLDERS, node_prefix
from trainguard.core.backends.kubernetes import kinds, localdir
from trainguard.core.backends.kubernetes.collector import training_container
from trainguard.core.backends.kubernetes.scene import KUBERNETES, ClusterWriter, Scene, pod_reason, terminated_state


def multi_node(s: Scene) -> bool:
    """Whether the attempt ran on several pods: an Indexed Job of two or more completions, a PyTorchJob
    of two or more replicas (or, with the object gone, pods of two node ranks)."""
    index_of = kinds.index_of(s.kind)
    return kinds.pods_of(s.job or {}) > 1 or len({index_of(p) for p in s.pods} - {None}) > 1


def pods_by_index(s: Scene) -> dict[int, dict[str, Any]]:
    """Each node rank's pod: the first one of the index that ended (a replacement after an ignored
    disruption came later), else its newest."""
    index_of = kinds.index_of(s.kind)
    chosen: dict[int, dict[str, Any]] = {}
    for pod in s.pods:  # oldest first
        index = index_of(pod)
        if index is None:
            continue
        held = chosen.get(index)
        if held is None or (held.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            chosen[index] = pod
    return chosen


def _entry(s: Scene, index: int, pod: Mapping[str, Any], nprocs: int, names: list[str]) -> dict[str, Any]:
    """What `attempt.json` says of one node rank's pod."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    container = str((training_container(spec) or {}).get("name") or "")
    cstatus: Mapping[str, Any] = next(
        (c for c in status.get("containerStatuses") or () if c.get("name") == container), {})
    done = terminated_state(cstatus) or {}
    reason, message = pod_reason(pod, s.job, cstatus)
    failed = done.get("exitCode") not in (None, 0) or status.get("phase") == "Failed"
    own = f"kubernetes/pods/{meta.get('name')}"
    prefix = node_prefix(index)
    items = [n for n in names if n == f"{own}.json" or n.startswith(f"{own}/")
             or (n.startswith(prefix) if prefix else not n.startswith(("kubernetes/", f"{NODE_FOLDERS}/")))]
    return {"index": index, "pod": meta.get("name"), "node": spec.get("nodeName"),
            "ranks": [index * nprocs + r for r in range(nprocs)], "exit_code": done.get("exitCode"),
            "reason": reason, "message": message, "started_at": done.get("startedAt") or status.get("startTime"),
            "finished_at": done.get("finishedAt"), "first_error_at": done.get("finishedAt") if failed else None,
            "conditions": list(status.get("conditions") or ()), "evidence": sorted(items)}


def _nprocs(s: Scene) -> int:
    """Ranks per node: the pods' `PET_NPROC_PER_NODE` (a PyTorchJob's operator sets it from `nprocPerNode`)."""
    template = kinds.pod_template(s.job or {}) or {}
    env = {e.get("name"): e.get("value") for e in (training_container(template) or {}).get("env") or ()}
    value = str(env.get("PET_NPROC_PER_NODE") or ((s.job or {}).get("spec") or {}).get("nprocPerNode") or "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def map_attempt(c: ClusterWriter, s: Scene) -> dict[str, Any]:
    """``attempt.json``: every node rank of the attempt, its pod and its evidence; stored and returned."""
    names = [item.name for item in c.items]
    nprocs, width = _nprocs(s), kinds.pods_of(s.job or {}) if s.job else 0
    entries = {i: _entry(s, i, pod, nprocs, names) for i, pod in pods_by_index(s).items()}
    for missing in c.missing:  # a pod already gone: its name still says its index
        pod = missing.name.removeprefix("kubernetes/pods/").removesuffix(".json")
        index = kinds.index_from_name(s.kind, pod, s.job_name) if missing.name.startswith("kubernetes/pods/") else None
        if index is not None and index not in entries:
            entries[index] = {"index": index, "pod": pod, "absent": missing.reason,
                              "ranks": [index * nprocs + r for r in range(nprocs)], "evidence": []}
    for index in range(width):
        entries.setdefault(index, {"index": index, "pod": None, "ranks": [index * nprocs + r for r in range(nprocs)],
                                   "absent": "no pod of this index was seen: never created, or deleted without a trace",
                                   "evidence": []})
    mapped = {"job": s.job_name, "nodes": max(width, len(entries)), "processes_per_node": nprocs,
              "service": _service(s),
              "indexes": [entries[i] for i in sorted(entries)]}
    c.put_json(KEPT_NODE_MAP, mapped, KUBERNETES)
    return mapped


def _service(s: Scene) -> str | None:
    """The headless Service the pods meet through: the attempt's own, or the PyTorchJob master's."""
    if s.kind == kinds.PYTORCHJOB:
        return f"{s.job_name}-master-0"  # the operator's, which MASTER_ADDR names
    name = ((s.service or {}).get("metadata") or {}).get("name")
    return str(name) if name else None


def keep_nodes(c: ClusterWriter, s: Scene, mapped: Mapping[str, Any], kept_dir: Path) -> None:
    """Keep what triage reads of every node on this machine: the map, each node's files, each pod's log."""
    localdir.ensure_private(kept_dir)
    shutil.rmtree(kept_dir / KEPT_VOLUME, ignore_errors=True)
    for name, spool in s.node_files.items():
        target = kept_dir / KEPT_VOLUME / name
        localdir.make_dirs(target.parent, kept_dir)
        localdir.copy_private(spool, target)
    localdir.make_dirs(kept_dir / KEPT_PODS, kept_dir)
    for (pod, container, previous), spool in s.logs.items():
        if not previous and container == _container_of(s, pod):
            localdir.copy_private(spool, kept_dir / KEPT_PODS / f"{pod}.log")
    # the termination messages in it can be a log's tail, secrets and all: masked as the store's copy is
    masked = masking.mask_tree(dict(mapped), c.masker)
    localdir.write_private(kept_dir / KEPT_NODE_MAP, json.dumps(masked, indent=2, sort_keys=True).encode("utf-8"))


def _container_of(s: Scene, pod_name: str) -> str | None:
    pod = next((p for p in s.pods if (p.get("metadata") or {}).get("name") == pod_name), None)
    return str((training_container((pod or {}).get("spec") or {}) or {}).get("name") or "") or None
