"""Server-side printing (`as=Table`): ports of the apiserver's printers for the kinds kubectl lists.

Ported from kubernetes/pkg/printers/internalversion/printers.go (1.32): printPod, printJob,
printEvent, printNode, printService, and the Name/Age default; PyTorchJob rows follow its CRD's
additionalPrinterColumns (State, Age) as the apiextensions table convertor renders them. Content negotiation belongs to the server.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

Column = tuple[str, str, int]  # (name, type, priority)


def _parse(ts: str | None) -> float | None:
    if not ts:
        return None
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    years = days // 365
    return f"{years}y{days % 365}d" if years < 8 else f"{years}y"


def since(ts: str | None) -> str:
    """translateTimestampSince: `<unknown>` for a missing time."""
    at = _parse(ts)
    return "<unknown>" if at is None else human_duration(time.time() - at)


def _finished(c: dict[str, Any]) -> float:
    return _parse(((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt")) or 0.0


def _init_status(pod: dict[str, Any], reason: str) -> tuple[str, bool, int, int, float]:
    """printPod's loop over init container statuses: (reason, initializing, restarts, ready
    sidecars, newest restart time). Once the pod is initialized only the sidecars' restarts
    count; a started sidecar counts as initialized and, when ready, as a ready container."""
    status = pod.get("status") or {}
    inits = (pod.get("spec") or {}).get("initContainers") or []
    sidecar_names = {c.get("name") for c in inits if c.get("restartPolicy") == "Always"}
    restarts, sidecar_restarts, ready, last, sidecar_last = 0, 0, 0, 0.0, 0.0
    initializing = False
    for i, c in enumerate(status.get("initContainerStatuses") or []):
        restarts += int(c.get("restartCount") or 0)
        last = max(last, _finished(c))
        sidecar = c.get("name") in sidecar_names
        if sidecar:
            sidecar_restarts += int(c.get("restartCount") or 0)
            sidecar_last = max(sidecar_last, _finished(c))
        state = c.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term and term.get("exitCode") == 0:
            continue
        if sidecar and c.get("started"):
            ready += 1 if c.get("ready") else 0
            continue
        initializing = True
        if term:
            detail = term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal")
                                             else f"ExitCode:{term.get('exitCode')}")
            reason = f"Init:{detail}"
        elif wait and wait.get("reason") and wait["reason"] != "PodInitializing":
            reason = f"Init:{wait['reason']}"
        else:
            reason = f"Init:{i}/{len(inits)}"
        break
    initialized = any(c.get("type") == "Initialized" and c.get("status") == "True"
                      for c in status.get("conditions") or [])
    if not initializing or initialized:
        return reason, False, sidecar_restarts, ready, sidecar_last
    return reason, True, restarts, ready, last


def _containers_status(status: dict[str, Any], reason: str) -> tuple[str, int, int, float]:
    """printPod's loop over container statuses, last to first: (reason, restarts, ready,
    newest restart time)."""
    restarts, ready, last_restart, running = 0, 0, 0.0, False
    for c in reversed(status.get("containerStatuses") or []):
        restarts += int(c.get("restartCount") or 0)
        finished = _parse(((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
        last_restart = max(last_restart, finished or 0.0)
        state = c.get("state") or {}
        wait, term = state.get("waiting") or {}, state.get("terminated")
        if wait.get("reason"):
            reason = wait["reason"]
        elif term is not None and term.get("reason"):
            reason = term["reason"]
        elif term is not None:
            reason = (f"Signal:{term['signal']}" if term.get("signal")
                      else f"ExitCode:{term.get('exitCode')}")
        elif c.get("ready") and "running" in state:
            running, ready = True, ready + 1
    if reason == "Completed" and running:
        has_ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
        reason = "Running" if has_ready else "NotReady"
    return reason, restarts, ready, last_restart


def _pod_cells(pod: dict[str, Any]) -> list[Any]:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or ""
    if any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
           for c in status.get("conditions") or []):
        reason = "SchedulingGated"
    reason, initializing, restarts, ready, last_restart = _init_status(pod, reason)
    if not initializing:
        reason, more, ready_more, last_more = _containers_status(status, reason)
        restarts, ready, last_restart = restarts + more, ready + ready_more, max(last_restart,
                                                                                 last_more)
    if meta.get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    restarts_cell = str(restarts)
    if restarts and last_restart:
        restarts_cell = f"{restarts} ({human_duration(time.time() - last_restart)} ago)"
    gates = spec.get("readinessGates") or []
    total = len(spec.get("containers") or []) + sum(  # sidecars count as containers
        1 for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always")
    return [meta["name"], f"{ready}/{total}", reason, restarts_cell,
            since(meta.get("creationTimestamp")), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>",
            f"{len(gates)}" if gates else "<none>"]


def _job_cells(job: dict[str, Any]) -> list[Any]:
    meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    true = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
    state = next((label for cond, label in (("Complete", "Complete"), ("Failed", "Failed"),
                                            ("_deleting", "Terminating"),
                                            ("Suspended", "Suspended"),
                                            ("FailureTarget", "FailureTarget"),
                                            ("SuccessCriteriaMet", "SuccessCriteriaMet"))
                  if cond in true or (cond == "_deleting" and meta.get("deletionTimestamp"))),
                 "Running")
    completions = spec.get("completions")
    done = f"{status.get('succeeded', 0)}/{completions}" if completions is not None \
        else f"{status.get('succeeded', 0)}/1 of {spec.get('parallelism', 1)}"
    start, end = _parse(status.get("startTime")), _parse(status.get("completionTime"))
    duration = "" if start is None else human_duration((end or time.time()) - start)
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    selector = ",".join(f"{k}={v}" for k, v in
                        ((spec.get("selector") or {}).get("matchLabels") or {}).items())
    return [meta["name"], state, done, duration, since(meta.get("creationTimestamp")),
            ",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers), selector or "<none>"]


def _event_cells(event: dict[str, Any]) -> list[Any]:
    first = since(event.get("firstTimestamp") or event.get("eventTime"))
    last = since(event["lastTimestamp"]) if event.get("lastTimestamp") else first
    count = int(event.get("count") or 1)
    if count > 1:
        last = f"{last} (x{count} over {first})"
    ref = event.get("involvedObject") or {}
    source = event.get("source") or {}
    src = source.get("component") or event.get("reportingComponent") or ""
    if source.get("host"):
        src = f"{src}, {source['host']}"
    return [last, event.get("type", ""), event.get("reason", ""),
            f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}",
            ref.get("fieldPath", ""), src, (event.get("message") or "").strip(), first, count,
            event["metadata"]["name"]]


def _node_cells(node: dict[str, Any]) -> list[Any]:
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else {"True": "Ready", "False": "NotReady"}.get(
        ready.get("status"), "Unknown")
    if ready is not None and ready.get("status") == "Unknown":
        state = "NotReady"
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in meta.get("labels") or {}
                   if k.startswith("node-role.kubernetes.io/"))
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [meta["name"], state, ",".join(roles) or "<none>", since(meta.get("creationTimestamp")),
            info.get("kubeletVersion", ""), addresses.get("InternalIP", "<none>"),
            addresses.get("ExternalIP", "<none>"), info.get("osImage", "<unknown>"),
            info.get("kernelVersion", "<unknown>"), info.get("containerRuntimeVersion", "")]


def _service_cells(svc: dict[str, Any]) -> list[Any]:
    meta, spec = svc["metadata"], svc.get("spec") or {}
    kind = spec.get("type", "ClusterIP")
    external = ",".join(spec.get("externalIPs") or []) or "<none>"
    if kind == "ExternalName":
        external = spec.get("externalName") or "<none>"
    ports = ",".join(
        (f"{p['port']}:{p['nodePort']}/{p.get('protocol', 'TCP')}" if p.get("nodePort")
         else f"{p['port']}/{p.get('protocol', 'TCP')}") for p in spec.get("ports") or [])
    selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
    return [meta["name"], kind, spec.get("clusterIP") or "<none>", external, ports or "<none>",
            since(meta.get("creationTimestamp")), selector or "<none>"]


def _pytorchjob_cells(job: dict[str, Any]) -> list[Any]:
    conditions = (job.get("status") or {}).get("conditions") or []
    state = conditions[-1]["type"] if conditions else None  # `.status.conditions[-1:].type`
    return [job["metadata"]["name"], state, since(job["metadata"].get("creationTimestamp"))]


_S, _I, _D = "string", "integer", "date"
PRINTERS: dict[str, tuple[list[Column], Any]] = {
    "pods": ([("Name", _S, 0), ("Ready", _S, 0), ("Status", _S, 0), ("Restarts", _S, 0),
              ("Age", _S, 0), ("IP", _S, 1), ("Node", _S, 1), ("Nominated Node", _S, 1),
              ("Readiness Gates", _S, 1)], _pod_cells),
    "jobs": ([("Name", _S, 0), ("Status", _S, 0), ("Completions", _S, 0), ("Duration", _S, 0),
              ("Age", _S, 0), ("Containers", _S, 1), ("Images", _S, 1), ("Selector", _S, 1)],
             _job_cells),
    "events": ([("Last Seen", _S, 0), ("Type", _S, 0), ("Reason", _S, 0), ("Object", _S, 0),
                ("Subobject", _S, 1), ("Source", _S, 1), ("Message", _S, 0),
                ("First Seen", _S, 1), ("Count", _I, 1), ("Name", _S, 1)], _event_cells),
    "nodes": ([("Name", _S, 0), ("Status", _S, 0), ("Roles", _S, 0), ("Age", _S, 0),
               ("Version", _S, 0), ("Internal-IP", _S, 1), ("External-IP", _S, 1),
               ("OS-Image", _S, 1), ("Kernel-Version", _S, 1), ("Container-Runtime", _S, 1)],
              _node_cells),
    "services": ([("Name", _S, 0), ("Type", _S, 0), ("Cluster-IP", _S, 0),
                  ("External-IP", _S, 0), ("Port(s)", _S, 0), ("Age", _S, 0),
                  ("Selector", _S, 1)], _service_cells),
    "pytorchjobs": ([("Name", _S, 0), ("State", _S, 0), ("Age", _D, 0)], _pytorchjob_cells),
}
_DEFAULT: tuple[list[Column], Any] = (
    [("Name", _S, 0), ("Age", _S, 0)],
    lambda o: [o["metadata"]["name"], since(o["metadata"].get("creationTimestamp"))])


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"]}


def table(resource: str, objects: list[dict[str, Any]], resource_version: str,
          include: str = "Metadata", extra_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table of objects, with all columns (kubectl hides priority 1)."""
    columns, cells = PRINTERS.get(resource, _DEFAULT)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": cells(obj)}
        embedded = _row_object(obj, include)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    definitions = [{"name": n, "type": t, "format": "name" if n == "Name" else "",
                    "description": n, "priority": p} for n, t, p in columns]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version, **(extra_meta or {})},
            "columnDefinitions": definitions, "rows": rows}
