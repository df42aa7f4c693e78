"""Admission: the defaults the apiserver fills in and the validation it refuses with 422.

Only the defaults that clients and kubectl visibly rely on (pkg/apis/core/v1/defaults.go,
pkg/apis/batch/v1/defaults.go) and the checks the project can trip over. Storage and HTTP do
not belong here.
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from kubesim import kubeflow, services
from kubesim.errors import Invalid

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character (e.g. "
            "'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")

_NOT_READY_TOLERATIONS = [
    {"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300} for k in ("not-ready", "unreachable")]

Cause = tuple[str, str, str]


def _image_pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    if ":" not in tail or tail.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def _qos_class(containers: list[dict[str, Any]]) -> str:
    requests_seen, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        requests_seen = requests_seen or bool(req) or bool(lim)
        for name in ("cpu", "memory"):
            if name not in lim or req.get(name, lim[name]) != lim[name]:
                guaranteed = False
    if not requests_seen:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def default_pod_spec(spec: dict[str, Any]) -> None:
    """Fill a PodSpec's defaults in place (also used for Job templates)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    if "serviceAccountName" not in spec:
        spec["serviceAccountName"] = spec.get("serviceAccount", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for container in spec.get("containers") or []:
        _default_container(container)
    for container in spec.get("initContainers") or []:
        _default_container(container)


def _default_container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("imagePullPolicy", _image_pull_policy(container.get("image") or ""))
    container.setdefault("resources", {})
    res = container["resources"]
    # Limits imply requests, as the apiserver defaults them.
    for name, value in (res.get("limits") or {}).items():
        res.setdefault("requests", {}).setdefault(name, value)


def default_pod(pod: dict[str, Any]) -> None:
    """Fill a Pod's defaults and initial status in place."""
    spec = pod.setdefault("spec", {})
    default_pod_spec(spec)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for toleration in _NOT_READY_TOLERATIONS:
        if not any(t.get("key") == toleration["key"] for t in tolerations):
            tolerations.append(copy.deepcopy(toleration))
    pod["status"] = {"phase": "Pending",
                     "qosClass": _qos_class(spec.get("containers") or [])}


def default_job(job: dict[str, Any]) -> None:
    """Fill a Job's defaults (selector and template labels from a pre-assigned uid)."""
    meta = job.setdefault("metadata", {})
    uid = meta.setdefault("uid", str(uuid.uuid4()))
    spec = job.setdefault("spec", {})
    spec.setdefault("parallelism", 1)
    if spec.get("completionMode") != "Indexed":  # an Indexed Job must say (validation)
        spec.setdefault("completions", 1)
    # With a limit per index the global one steps aside (pkg/apis/batch/v1/defaults.go).
    spec.setdefault("backoffLimit", 2147483647 if "backoffLimitPerIndex" in spec else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    spec.setdefault("podReplacementPolicy",
                    "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
    template = spec.setdefault("template", {})
    tmeta = template.setdefault("metadata", {})
    labels = tmeta.setdefault("labels", {})
    if not spec["manualSelector"]:
        name = meta.get("name", "")
        labels.update({"batch.kubernetes.io/controller-uid": uid,
                       "batch.kubernetes.io/job-name": name,
                       "controller-uid": uid, "job-name": name})
        spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    default_pod_spec(template.setdefault("spec", {}))
    job["status"] = {}


def default(resource: str, obj: dict[str, Any]) -> None:
    """Apply the create-time defaults of a resource in place."""
    if resource == "pods":
        default_pod(obj)
    elif resource == "jobs":
        default_job(obj)
    elif resource == "namespaces":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = {"phase": "Active"}
        labels = obj.setdefault("metadata", {}).setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"].get("name", "")
    elif resource == "secrets":
        obj.setdefault("type", "Opaque")
    elif resource == "services":
        services.default(obj)
    elif resource == "pytorchjobs":
        kubeflow.default(obj)


def _containers_causes(spec: dict[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("FieldValueRequired", f"{path}.containers", "Required value"))
    for i, c in enumerate(containers):
        if not c.get("name"):
            causes.append(("FieldValueRequired", f"{path}.containers[{i}].name",
                           "Required value"))
        if not c.get("image"):
            causes.append(("FieldValueRequired", f"{path}.containers[{i}].image",
                           "Required value"))
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            for j, mount in enumerate(c.get("volumeMounts") or []):
                causes += _sub_path_causes(str(mount.get("subPath") or ""),
                                           f"{path}.{key}[{i}].volumeMounts[{j}].subPath")
    return causes + _node_affinity_causes(spec, path)


_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _node_affinity_causes(spec: dict[str, Any], path: str) -> list[Cause]:
    """pkg/apis/core/validation ValidateNodeSelector (1.32, kubernetes#128212): a matchExpressions value
    is a label value (63 characters at most, alphanumerics with '-', '_' or '.' between); a matchFields
    requirement keys `metadata.name` and, with In or NotIn, holds exactly one value."""
    causes: list[Cause] = []
    required = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution")) or {})
    for t, term in enumerate(required.get("nodeSelectorTerms") or []):
        where = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{t}]"
        for e, expression in enumerate(term.get("matchExpressions") or []):
            for v, value in enumerate(expression.get("values") or []):
                if len(str(value)) > 63 or not _LABEL_VALUE.fullmatch(str(value)):
                    causes.append(("FieldValueInvalid", f"{where}.matchExpressions[{e}].values[{v}]",
                                   f'Invalid value: "{value}": a valid label must be an empty string or consist of '
                                   "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                                   "alphanumeric character"))
        for f, requirement in enumerate(term.get("matchFields") or []):
            if requirement.get("key") != "metadata.name":
                causes.append(("FieldValueNotSupported", f"{where}.matchFields[{f}].key",
                               f'Unsupported value: "{requirement.get("key")}": supported values: "metadata.name"'))
            if requirement.get("operator") in ("In", "NotIn") and len(requirement.get("values") or []) != 1:
                causes.append(("FieldValueRequired", f"{where}.matchFields[{f}].values",
                               "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node "
                               "field selector"))
    return causes


def _sub_path_causes(sub_path: str, field: str) -> list[Cause]:
    """pkg/apis/core/validation validateLocalDescendingPath: relative, and no '..' element."""
    causes: list[Cause] = []
    if sub_path.startswith("/"):
        causes.append(("FieldValueInvalid", field, f'Invalid value: "{sub_path}": must be a relative path'))
    if ".." in sub_path.replace("\\", "/").split("/"):
        causes.append(("FieldValueInvalid", field, f'Invalid value: "{sub_path}": must not contain \'..\''))
    return causes


def _job_causes(job: dict[str, Any]) -> list[Cause]:
    spec = job.get("spec") or {}
    tspec = (spec.get("template") or {}).get("spec") or {}
    path = "spec.template.spec"
    causes = _containers_causes(tspec, path)
    policy = tspec.get("restartPolicy")
    if policy not in ("Never", "OnFailure"):
        causes.append(("FieldValueNotSupported", f"{path}.restartPolicy",
                       f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"'))
    if spec.get("podFailurePolicy") and policy != "Never":
        causes.append(("FieldValueInvalid", f"{path}.restartPolicy",
                       "Invalid value: \"" + str(policy) + "\": only \"Never\" is supported "
                       "when podFailurePolicy is specified"))
    if int(spec.get("backoffLimit", 0)) < 0:
        causes.append(("FieldValueInvalid", "spec.backoffLimit",
                       f"Invalid value: {spec['backoffLimit']}: must be greater than or equal "
                       "to 0"))
    return causes + _indexed_causes(spec)


def _indexed_causes(spec: dict[str, Any]) -> list[Cause]:
    """The Indexed-only fields' checks (pkg/apis/batch/validation ValidateJobSpec, 1.32)."""
    causes: list[Cause] = []
    indexed = spec.get("completionMode") == "Indexed"
    per_index, most = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes")
    if indexed and spec.get("completions") is None:
        causes.append(("FieldValueRequired", "spec.completions",
                       "Required value: when completion mode is Indexed"))
    for field, value in (("backoffLimitPerIndex", per_index), ("maxFailedIndexes", most)):
        if value is not None and not indexed:
            causes.append(("FieldValueInvalid", f"spec.{field}",
                           f"Invalid value: {value}: requires indexed completion mode"))
    if most is not None and per_index is None:
        causes.append(("FieldValueRequired", "spec.backoffLimitPerIndex",
                       "Required value: when maxFailedIndexes is specified"))
    if indexed and most is not None and spec.get("completions") is not None and (
            int(most) > int(spec["completions"])):
        causes.append(("FieldValueInvalid", "spec.maxFailedIndexes",
                       f"Invalid value: {most}: must be less than or equal to completions"))
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
        if rule.get("action") == "FailIndex" and per_index is None:
            causes.append(("FieldValueInvalid", f"spec.podFailurePolicy.rules[{i}].action",
                           'Invalid value: "FailIndex": requires the backoffLimitPerIndex to '
                           "be set"))
    return causes


def validate(resource: str, obj: dict[str, Any]) -> None:
    """Raise Invalid (422) listing every cause, as the apiserver does."""
    name = (obj.get("metadata") or {}).get("name") or ""
    if resource == "pytorchjobs":
        kubeflow.validate(obj)  # a validating webhook: refusals are 403s in its own words
        return
    causes: list[Cause] = []
    pattern = _LABEL if resource == "namespaces" else _SUBDOMAIN
    if resource == "services":
        causes += services.causes(obj)
    elif name and (not pattern.match(name) or len(name) > 253):
        causes.append(("FieldValueInvalid", "metadata.name", f'Invalid value: "{name}": '
                       + _DNS_MSG))
    if resource == "pods":
        causes += _containers_causes(obj.get("spec") or {}, "spec")
    elif resource == "jobs":
        causes += _job_causes(obj)
    if causes:
        raise Invalid.of(resource, name, causes)


def validate_update(resource: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse changes to fields the apiserver keeps immutable."""
    name = old["metadata"]["name"]
    if resource == "services" and services.update_causes(old, new):
        raise Invalid.of(resource, name, services.update_causes(old, new))
    if resource == "jobs":
        old_t = (old.get("spec") or {}).get("template")
        new_t = (new.get("spec") or {}).get("template")
        if old_t != new_t:
            raise Invalid.of(resource, name, [("FieldValueInvalid", "spec.template",
                                               "field is immutable")])
    if resource == "pods":
        keep = ("containers", "restartPolicy", "nodeName", "volumes")
        old_s, new_s = old.get("spec") or {}, new.get("spec") or {}
        if old_s.get("nodeName") and any(old_s.get(k) != new_s.get(k) for k in keep):
            raise Invalid.of(resource, name, [("FieldValueForbidden", "spec",
                                               "Forbidden: pod updates may not change fields "
                                               "other than `spec.containers[*].image`, "
                                               "`spec.activeDeadlineSeconds`, "
                                               "`spec.tolerations` (only additions to existing "
                                               "tolerations) or "
                                               "`spec.terminationGracePeriodSeconds`")])
    validate(resource, new)
