"""Job pod failure policies: which rule a failed pod matches, in the job controller's words.

pkg/controller/job/pod_failure_policy.go of Kubernetes 1.32: rules in order, the first match
wins; `onExitCodes` (containers, then init containers; exit code 0 never matches) and
`onPodConditions`; actions FailJob (with its message), FailIndex, Ignore and Count. What the
controller does with the action is jobs.py's.
"""

from __future__ import annotations

from typing import Any


def match_pod_failure_policy(job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
    """(action, FailJob message) of the first rule matching a failed pod, or None."""
    rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
    meta = pod["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    for index, rule in enumerate(rules):
        on_codes = rule.get("onExitCodes")
        if on_codes:
            hit = _exit_code_match(pod, on_codes)
            if hit is not None:
                return rule["action"], (f"Container {hit[0]} for pod {where} failed with exit "
                                        f"code {hit[1]} matching FailJob rule at index {index}")
        for pattern in rule.get("onPodConditions") or []:
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond["type"] == pattern["type"] and cond["status"] == pattern.get("status", "True"):
                    return rule["action"], (f"Pod {where} has condition {cond['type']} "
                                            f"matching FailJob rule at index {index}")
    return None


def _exit_code_match(pod: dict[str, Any], rule: dict[str, Any]) -> tuple[str, int] | None:
    status = pod.get("status", {})
    for statuses in (status.get("containerStatuses"), status.get("initContainerStatuses")):
        for cs in statuses or []:
            if rule.get("containerName") and cs["name"] != rule["containerName"]:
                continue
            code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
            if code is None or code == 0:
                continue
            inside = code in rule.get("values", [])
            if inside == (rule.get("operator", "In") == "In"):
                return cs["name"], int(code)
    return None
