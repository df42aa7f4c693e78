"""Indexed Jobs: completion indexes, their interval strings, per-index back-off and the success
policy, as pkg/controller/job (indexed_job_utils.go, success_policy.go) of Kubernetes 1.32 has
them.

What belongs here: `completedIndexes`/`failedIndexes` as compressed intervals ("1,3-5,7": three
or more consecutive indexes become a range, two stay a pair), the index of a pod, when a failed
pod fails its index (backoffLimitPerIndex, FailIndex), the indexes to start next, what a pod of
one index gets (name prefix, annotation and label, hostname, JOB_COMPLETION_INDEX, the
index-failure-count annotations), and matching `successPolicy` rules.

What does not: the Job controller's loop and conditions (jobs.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

INDEX = "batch.kubernetes.io/job-completion-index"
FAILURES = "batch.kubernetes.io/job-index-failure-count"
IGNORED = "batch.kubernetes.io/job-index-ignored-failure-count"
ENV = "JOB_COMPLETION_INDEX"
_MAX_GENERATED_NAME = 63 - 5  # names.MaxGeneratedNameLength: room for the random suffix


def indexed(job: dict[str, Any]) -> bool:
    return job["spec"].get("completionMode") == "Indexed"


def per_index(job: dict[str, Any]) -> bool:
    return job["spec"].get("backoffLimitPerIndex") is not None


def parse(text: str | None, completions: int) -> set[int]:
    """The indexes an interval string names, those below `completions` only."""
    found: set[int] = set()
    for part in (text or "").split(","):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            continue  # the controller logs a corrupted interval and skips it
        found.update(range(low, min(high, completions - 1) + 1))
    return found


def render(indexes: Iterable[int]) -> str:
    """orderedIntervals.String(): "0-2,4,6,7"."""
    ordered, parts = sorted(set(indexes)), []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[start], ordered[end]
        parts.append(str(first) if first == last else
                     f"{first},{last}" if last == first + 1 else f"{first}-{last}")
        start = end + 1
    return ",".join(parts)


def of(pod: dict[str, Any]) -> int | None:
    """The pod's completion index from its annotation, None when absent or invalid."""
    value = (pod["metadata"].get("annotations") or {}).get(INDEX)
    try:
        index = int(value or "")
    except ValueError:
        return None
    return index if index >= 0 else None


def _count(pod: dict[str, Any], key: str) -> int:
    try:
        return max(int((pod["metadata"].get("annotations") or {}).get(key) or 0), 0)
    except ValueError:
        return 0


def finished_at(pod: dict[str, Any]) -> float:
    """When the pod's last container ended (its creation time if none did): where an index's
    back-off starts."""
    def epoch(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    ends = [epoch(cs["state"]["terminated"]["finishedAt"])
            for cs in (pod.get("status") or {}).get("containerStatuses") or []
            if ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")]
    return max(ends, default=epoch(pod["metadata"]["creationTimestamp"]))


def absolute_failures(pod: dict[str, Any]) -> int:
    """Failures of the pod's index before it, counted or ignored (the per-index back-off)."""
    return _count(pod, FAILURES) + _count(pod, IGNORED)


def fails_index(job: dict[str, Any], pod: dict[str, Any], action: str | None,
                counted: bool) -> bool:
    """isIndexFailed: a FailIndex rule matched, or a counted failure used the index's budget."""
    if action == "FailIndex":
        return True
    return counted and _count(pod, FAILURES) >= int(job["spec"]["backoffLimitPerIndex"])


def pending(job: dict[str, Any], busy: set[int], succeeded: set[int], failed: set[int],
            count: int) -> list[int]:
    """firstPendingIndexes: the lowest indexes neither running, succeeded nor failed."""
    completions = int(job["spec"]["completions"])
    free = [i for i in range(completions) if i not in busy | succeeded | failed]
    return free[:max(count, 0)]


def template(job: dict[str, Any], index: int, replaced: dict[str, Any] | None,
             counted: bool) -> dict[str, Any]:
    """What a pod of this index adds to the Job's template: metadata and spec fields.

    `replaced` is the index's last failed pod, whose failure counts carry over (one more,
    counted or ignored by the pod failure policy).
    """
    name = job["metadata"]["name"]
    suffix = f"-{index}-"
    prefix = (name + suffix) if len(name + suffix) <= _MAX_GENERATED_NAME else (
        name[:_MAX_GENERATED_NAME - len(suffix)] + suffix)
    annotations = {INDEX: str(index)}
    if per_index(job):
        failures, ignored = (0, 0) if replaced is None else (
            _count(replaced, FAILURES) + int(counted), _count(replaced, IGNORED) + int(not counted))
        annotations[FAILURES] = str(failures)
        if ignored:
            annotations[IGNORED] = str(ignored)
    return {"generateName": prefix, "annotations": annotations, "labels": {INDEX: str(index)},
            "hostname": f"{name}-{index}"}


def add_index_env(spec: dict[str, Any]) -> None:
    """JOB_COMPLETION_INDEX from the index label (PodIndexLabel), unless a container sets it."""
    ref = {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX}']"}}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        env = container.setdefault("env", [])
        if not any(item.get("name") == ENV for item in env):
            env.append({"name": ENV, "valueFrom": ref})


def success_policy(job: dict[str, Any], succeeded: set[int]) -> str | None:
    """matchSuccessPolicy: "Matched rules at index N" for the first rule met, else None."""
    rules = (job["spec"].get("successPolicy") or {}).get("rules") or []
    completions = int(job["spec"]["completions"])
    if not succeeded:
        return None
    for number, rule in enumerate(rules):
        count = rule.get("succeededCount")
        if rule.get("succeededIndexes") is not None:
            required = parse(rule["succeededIndexes"], completions)
            if not required:
                continue
            hits = len(required & succeeded)
            if hits == len(required) or (count is not None and hits >= int(count)):
                return f"Matched rules at index {number}"
        elif count is not None and len(succeeded) >= int(count):
            return f"Matched rules at index {number}"
    return None
