"""What a pod that is not running yet waits for, in trainguard's words, read from wire-form pods.

The payloads are the shapes the API server sends (and kubesim serves): a pod no scheduler has
looked at has no `PodScheduled` condition at all; a refused one has `PodScheduled=False` with the
scheduler's message; a bound one waits on its containers' `waiting` states.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.core.backends.kubernetes.podstate import never_scheduled, not_scheduled, waiting_for

REFUSED = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: "
           "2 No preemption victims found for incoming pod.")


def pod(spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "train-r-1-0-x7k2p"},
            "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "train"}], **(spec or {})},
            "status": {"phase": "Pending", **status}}


def scheduled(status: str, reason: str | None = None, message: str | None = None) -> list[dict[str, Any]]:
    return [{"type": "PodScheduled", "status": status, **({"reason": reason} if reason else {}),
             **({"message": message} if message else {})}]


def waiting(reason: str, message: str = "") -> list[dict[str, Any]]:
    return [{"name": "train", "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}]


ON_NODE = {"nodeName": "gpu-node-1"}


@pytest.mark.parametrize(("given", "expected"), [
    (pod({"schedulerName": "gpu-batch"}),
     ("to be scheduled", "no scheduler has decided yet (schedulerName: gpu-batch)")),
    (pod(conditions=scheduled("False", "Unschedulable", REFUSED)),
     ("to be scheduled", f"default-scheduler says: {REFUSED}")),
    (pod(conditions=scheduled("False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")),
     ("to be scheduled", "SchedulingGated: Scheduling is blocked due to non-empty scheduling gates")),
    (pod(ON_NODE, conditions=scheduled("True")), ("to start on gpu-node-1", "the kubelet has not reported its containers yet")),
    (pod(ON_NODE, containerStatuses=waiting("ContainerCreating")), ("to start on gpu-node-1", "ContainerCreating")),
    (pod(ON_NODE, containerStatuses=waiting("ErrImagePull", "pull access denied for ghcr.io/acme/trian")),
     ("to start on gpu-node-1", "ErrImagePull: pull access denied for ghcr.io/acme/trian")),
    (pod(ON_NODE, phase="Running", containerStatuses=[{"name": "train", "state": {"running": {}}}]), None),
    (pod(ON_NODE, phase="Failed"), None),
    (pod(phase="Failed", reason="Evicted"), None),  # ended before it was ever bound: nothing to wait for
])
def test_what_a_pod_waits_for_names_the_missing_step(given: dict[str, Any], expected: tuple[str, str] | None) -> None:
    assert waiting_for(given) == expected


def test_a_pod_being_deleted_waits_for_nothing_and_is_not_counted_as_unscheduled() -> None:
    going = pod({"schedulerName": "gpu-batch"})
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert waiting_for(going) is None and not not_scheduled(going)
    assert not_scheduled(pod({"schedulerName": "gpu-batch"}))


def test_the_schedulers_words_are_shown_on_one_line_without_terminal_escapes_and_clipped() -> None:
    hostile = "0/2 nodes are available:\n2 node(s) had untolerated taint {evil: \x1b[31mred\x1b[0m}" + "x" * 5000
    what, missing = waiting_for(pod(conditions=scheduled("False", "Unschedulable", hostile))) or ("", "")
    assert "\n" not in missing and "\x1b" not in missing and "{evil: red}" in missing
    assert missing.endswith("…") and len(missing) < 1100


def test_a_pod_never_decided_on_ends_with_its_scheduler_name_and_the_question_to_ask() -> None:
    assert never_scheduled(pod({"schedulerName": "gpu-batch"}), "10m00s") == (
        "no scheduler decided on pod train-r-1-0-x7k2p in 10m00s (schedulerName: gpu-batch): "
        "is a scheduler of that name running?")
