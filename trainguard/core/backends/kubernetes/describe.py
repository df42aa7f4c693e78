"""A `kubectl describe pod`-style text built from a pod object and its events, with no kubectl.

The layout follows kubectl's own describer (k8s.io/kubectl/pkg/describe, `describePod`): the same
labels in the same order, tab-aligned in column blocks the way Go's text/tabwriter aligns them, so
a person reads the evidence as they read a cluster. Two deliberate differences: values of
variables with secret-looking names and URL passwords are shown as ``***``, and control
characters in any field are escaped, so neither a secret nor a terminal escape leaves through
this text. Collecting the objects belongs to ``evidence``; this module only renders.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from trainguard_entrypoint.redact import REDACTED, is_secret_name, redact_argv, redact_text

from trainguard.core.backends.kubernetes.gotext import human_duration, tabwrite

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
Obj = Mapping[str, Any]


def safe(value: object) -> str:
    """A field value as one safe piece of text: control characters (newlines too) and tabs escaped."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text).replace("\t", "\\t")


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 timestamp from the API as an aware datetime; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _rfc1123z(value: object) -> str:
    parsed = parse_time(value)
    return parsed.astimezone(UTC).strftime("%a, %d %b %Y %H:%M:%S %z") if parsed else safe(value)


def _since(value: object, now: datetime) -> str:
    parsed = parse_time(value)
    return human_duration((now - parsed).total_seconds()) if parsed else "<unknown>"


class _Text:
    """Lines at kubectl's indent levels (0, 2, 4, 6 spaces), cells separated by tabs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, level: int, *cells: object) -> None:
        self.lines.append("  " * level + "\t".join(safe(c) for c in cells))

    def multiline(self, title: str, entries: Sequence[str]) -> None:
        """kubectl's `printLabelsMultiline`: the first entry beside the title, the rest beneath it."""
        if not entries:
            self.add(0, f"{title}:", "<none>")
        for index, entry in enumerate(entries):
            self.add(0, f"{title}:" if index == 0 else "", entry)


def _labels(values: object) -> list[str]:
    if not isinstance(values, Mapping):
        return []
    return [f"{key}={values[key]}" for key in sorted(values)]


def _toleration(t: Obj) -> str:
    text = str(t.get("key") or "")
    if t.get("value"):
        text += f"={t['value']}"
    if t.get("effect"):
        text += f":{t['effect']}"
    if t.get("operator") == "Exists" and not t.get("value"):
        text += " op=Exists" if (t.get("key") or t.get("effect")) else "op=Exists"
    if t.get("tolerationSeconds") is not None:
        text += f" for {t['tolerationSeconds']}s"
    return text


def _state(w: _Text, title: str, state: Obj) -> None:
    if "running" in state:
        w.add(2, f"{title}:", "Running")
        w.add(3, "Started:", _rfc1123z((state["running"] or {}).get("startedAt")))
    elif "terminated" in state:
        done = state["terminated"] or {}
        w.add(2, f"{title}:", "Terminated")
        if done.get("reason"):
            w.add(3, "Reason:", done["reason"])
        if done.get("message"):
            first, *rest = redact_text(str(done["message"])).rstrip("\n").split("\n")
            w.add(3, "Message:", first)
            for line in rest:
                w.add(3, "", line)
        w.add(3, "Exit Code:", done.get("exitCode", 0))
        if done.get("signal"):
            w.add(3, "Signal:", done["signal"])
        w.add(3, "Started:", _rfc1123z(done.get("startedAt")))
        w.add(3, "Finished:", _rfc1123z(done.get("finishedAt")))
    else:
        w.add(2, f"{title}:", "Waiting")
        reason = (state.get("waiting") or {}).get("reason")
        if reason:
            w.add(3, "Reason:", reason)


def _env_value(var: Obj) -> tuple[str, ...]:
    source = var.get("valueFrom")
    if not isinstance(source, Mapping):
        value = str(var.get("value") or "")
        return (REDACTED if is_secret_name(str(var.get("name"))) and value else redact_text(value),)
    if ref := source.get("fieldRef"):
        return (f" ({ref.get('apiVersion') or ''}:{ref.get('fieldPath') or ''})",)
    if ref := source.get("resourceFieldRef"):
        return (f"{ref.get('resource')} ({ref.get('containerName') or ''})",)
    if ref := source.get("secretKeyRef"):
        return (f"<set to the key '{ref.get('key')}' in secret '{ref.get('name')}'>",
                f"Optional: {'true' if ref.get('optional') else 'false'}")
    if ref := source.get("configMapKeyRef"):
        return (f"<set to the key '{ref.get('key')}' of config map '{ref.get('name')}'>",
                f"Optional: {'true' if ref.get('optional') else 'false'}")
    return ("<unknown source>",)


def _ports(container: Obj) -> tuple[str, str]:
    ports = [p for p in container.get("ports") or () if isinstance(p, Mapping)]
    if not ports:
        return "<none>", "<none>"
    proto = [str(p.get("protocol") or "") for p in ports]  # as stored; the API server defaults TCP
    return (", ".join(f"{p.get('containerPort')}/{pr}" for p, pr in zip(ports, proto, strict=True)),
            ", ".join(f"{p.get('hostPort') or 0}/{pr}" for p, pr in zip(ports, proto, strict=True)))


def _container(w: _Text, container: Obj, status: Obj | None) -> None:
    w.add(1, f"{container.get('name')}:")
    if status is not None:
        w.add(2, "Container ID:", status.get("containerID") or "")
    w.add(2, "Image:", container.get("image") or "")
    if status is not None:
        w.add(2, "Image ID:", status.get("imageID") or "")
    port, host_port = _ports(container)
    w.add(2, "Port:", port)
    w.add(2, "Host Port:", host_port)
    for title, key in (("Command", "command"), ("Args", "args")):
        if container.get(key):
            w.add(2, f"{title}:")
            for arg in redact_argv([str(a) for a in container[key]]):
                for piece in arg.split("\n"):
                    w.add(3, piece)
    if status is not None:
        _state(w, "State", status.get("state") or {})
        if (status.get("lastState") or {}).get("terminated"):
            _state(w, "Last State", status["lastState"])
        w.add(2, "Ready:", "True" if status.get("ready") else "False")
        w.add(2, "Restart Count:", status.get("restartCount", 0))
    _resources(w, container.get("resources") or {})
    _env(w, container)
    _mounts(w, container.get("volumeMounts") or ())


def _resources(w: _Text, resources: Obj) -> None:
    for title, key in (("Limits", "limits"), ("Requests", "requests")):
        values = resources.get(key) or {}
        if values:
            w.add(2, f"{title}:")
        for name in sorted(values):
            w.add(3, f"{name}:", values[name])


def _env(w: _Text, container: Obj) -> None:
    for source in container.get("envFrom") or ():
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        optional = "true" if ref.get("optional") else "false"
        w.add(2, "Environment Variables from:")
        w.add(3, f"{ref.get('name')}", f"{kind}  with prefix '{source.get('prefix') or ''}'  Optional: {optional}")
    variables = [v for v in container.get("env") or () if isinstance(v, Mapping)]
    if not variables:
        w.add(2, "Environment:", "<none>")
        return
    w.add(2, "Environment:")
    for var in variables:
        first, *rest = _env_value(var)
        lines = first.split("\n")
        w.add(3, f"{var.get('name')}:", lines[0], *rest)
        for more in lines[1:]:
            w.add(3, "", more)


def _mounts(w: _Text, mounts: Iterable[Obj]) -> None:
    listed = [m for m in mounts if isinstance(m, Mapping)]
    if not listed:
        w.add(2, "Mounts:", "<none>")
        return
    w.add(2, "Mounts:")
    for m in listed:
        flags = ["ro" if m.get("readOnly") else "rw"]
        if m.get("subPath"):
            flags.append(f'path="{m["subPath"]}"')
        w.add(3, f"{m.get('mountPath')} from {m.get('name')} ({','.join(flags)})")


_VOLUME_TYPES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("persistentVolumeClaim", "PersistentVolumeClaim (a reference to a PersistentVolumeClaim in the same namespace)",
     (("ClaimName", "claimName"), ("ReadOnly", "readOnly"))),
    ("emptyDir", "EmptyDir (a temporary directory that shares a pod's lifetime)",
     (("Medium", "medium"), ("SizeLimit", "sizeLimit"))),
    ("hostPath", "HostPath (bare host directory volume)", (("Path", "path"), ("HostPathType", "type"))),
    ("configMap", "ConfigMap (a volume populated by a ConfigMap)", (("Name", "name"), ("Optional", "optional"))),
    ("secret", "Secret (a volume populated by a Secret)", (("SecretName", "secretName"), ("Optional", "optional"))),
)


def _volumes(w: _Text, volumes: Sequence[Obj]) -> None:
    if not volumes:
        w.add(0, "Volumes:", "<none>")
        return
    w.add(0, "Volumes:")
    for volume in volumes:
        w.add(1, f"{volume.get('name')}:")
        for key, kind, fields in _VOLUME_TYPES:
            if key in volume:
                source = volume[key] or {}
                w.add(2, "Type:", kind)
                for title, field in fields:
                    value = source.get(field)
                    if field in ("readOnly", "optional"):  # Go prints a bool's zero value
                        value = "true" if value else "false"
                    elif field == "sizeLimit" and value is None:
                        value = "<unset>"
                    w.add(2, f"{title}:", value or "")
                break
        else:
            w.add(2, "Type:", ", ".join(k for k in volume if k != "name") or "<unknown>")


def event_time(event: Obj) -> str:
    """The time an event last happened, for sorting: lastTimestamp, eventTime, firstTimestamp, created."""
    meta = event.get("metadata") or {}
    for value in (event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp"),
                  meta.get("creationTimestamp")):
        parsed = parse_time(value)
        if parsed:
            return parsed.astimezone(UTC).isoformat()
    return ""


def _events(w: _Text, events: Sequence[Obj], now: datetime) -> None:
    if not events:
        w.add(0, "Events:", "<none>")
        return
    w.add(0, "Events:")
    w.add(1, "Type", "Reason", "Age", "From", "Message")
    w.add(1, "----", "------", "----", "----", "-------")
    for event in sorted(events, key=event_time):
        first = event.get("firstTimestamp") or event.get("eventTime")
        age = _since(first, now)
        if int(event.get("count") or 1) > 1:
            age = f"{_since(event.get('lastTimestamp'), now)} (x{event['count']} over {age})"
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
        message = redact_text(str(event.get("message") or "").strip())
        w.add(1, event.get("type") or "", event.get("reason") or "", age, source, message)


def _controller(meta: Obj) -> str | None:
    for owner in meta.get("ownerReferences") or ():
        if isinstance(owner, Mapping) and owner.get("controller"):
            return f"{owner.get('kind')}/{owner.get('name')}"
    return None


def _header(w: _Text, pod: Obj, now: datetime) -> None:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    w.add(0, "Name:", meta.get("name"))
    w.add(0, "Namespace:", meta.get("namespace"))
    if spec.get("priority") is not None:
        w.add(0, "Priority:", spec["priority"])
    if spec.get("priorityClassName"):
        w.add(0, "Priority Class Name:", spec["priorityClassName"])
    w.add(0, "Service Account:", spec.get("serviceAccountName") or "")
    node = spec.get("nodeName")
    w.add(0, "Node:", f"{node}/{status.get('hostIP') or ''}" if node else "<none>")
    if status.get("startTime"):
        w.add(0, "Start Time:", _rfc1123z(status["startTime"]))
    w.multiline("Labels", _labels(meta.get("labels")))
    w.multiline("Annotations", _labels(meta.get("annotations")))
    if meta.get("deletionTimestamp"):
        w.add(0, "Status:", f"Terminating (lasts {_since(meta['deletionTimestamp'], now)})")
        w.add(0, "Termination Grace Period:", f"{meta.get('deletionGracePeriodSeconds') or 0}s")
    else:
        w.add(0, "Status:", status.get("phase") or "")
    for title in ("reason", "message"):
        if status.get(title):
            w.add(0, f"{title.capitalize()}:", status[title])
    w.add(0, "IP:", status.get("podIP") or "")
    ips = [ip.get("ip") for ip in status.get("podIPs") or () if isinstance(ip, Mapping)]
    if not ips:
        w.add(0, "IPs:", "<none>")
    else:
        w.add(0, "IPs:")
        for ip in ips:
            w.add(1, "IP:", ip)
    if controller := _controller(meta):
        w.add(0, "Controlled By:", controller)
    if status.get("nominatedNodeName"):
        w.add(0, "NominatedNodeName:", status["nominatedNodeName"])


def describe_pod(pod: Obj, events: Sequence[Obj] = (), *, now: datetime | None = None) -> str:
    """The text `kubectl describe pod` prints for ``pod`` with ``events``, ages counted from ``now``.

    Args:
        pod: The pod in wire form (as the API returns it).
        events: The pod's events in wire form (any order; shown oldest first).
        now: The moment ages are counted from (default: the current time).
    """
    now = now or datetime.now(UTC)
    w = _Text()
    _header(w, pod, now)
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    for title, key, status_key in (("Init Containers", "initContainers", "initContainerStatuses"),
                                   ("Containers", "containers", "containerStatuses"),
                                   ("Ephemeral Containers", "ephemeralContainers", "ephemeralContainerStatuses")):
        containers = [c for c in spec.get(key) or () if isinstance(c, Mapping)]
        if not containers and key != "containers":
            continue
        statuses = {s.get("name"): s for s in status.get(status_key) or () if isinstance(s, Mapping)}
        w.add(0, f"{title}:")
        for container in containers:
            _container(w, container, statuses.get(container.get("name")))
    conditions = [c for c in status.get("conditions") or () if isinstance(c, Mapping)]
    if conditions:
        w.add(0, "Conditions:")
        w.add(1, "Type", "Status")
        for cond in conditions:
            w.lines.append(f"  {safe(cond.get('type'))} \t{safe(cond.get('status'))} ")
    _volumes(w, [v for v in spec.get("volumes") or () if isinstance(v, Mapping)])
    w.add(0, "QoS Class:", status.get("qosClass") or "")
    w.multiline("Node-Selectors", _labels(spec.get("nodeSelector")))
    tolerations = [t for t in spec.get("tolerations") or () if isinstance(t, Mapping)]
    w.multiline("Tolerations", [_toleration(t) for t in tolerations])
    _events(w, events, now)
    return tabwrite(w.lines)
