"""Nothing waits in silence on Kubernetes: pods that are not running yet are reported while they wait,
and a pod no scheduler ever decides on ends the attempt as `unschedulable`, through the real flows.

A `schedulerName` that no scheduler serves is what a real cluster does with a typo in it, or with a
second scheduler (Volcano, a batch scheduler) that is not installed or is down: the pod stays Pending
with no event and no `PodScheduled` condition. kubesim's default scheduler leaves such pods alone, as
kube-scheduler does. Everything is real but the GPUs (kubesim's nodes advertise nvidia.com/gpu).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from simfixtures import sim_fixture
from kube_helpers import inline, kept, kube_blocks, run_logs
from flows.attempt import train_attempt
from trainguard.core.spec import parse_spec
from waiting import wait_for

sim = sim_fixture()
NOBODY = "gpu-batch-scheduler"
WINDOW = 11  # lines are due after 5 s and 10 s of waiting, the attempt ends at 11 s
WAIT_LINE = re.compile(r"trainguard: waiting (\d+)s \(of 11s\) for (pods? .+) to be scheduled: (.+)")


@pytest.fixture
def kb(sim: Any, prefect_server: str, tmp_path: Any) -> dict[str, Any]:
    template = {"spec": {"template": {"spec": {"schedulerName": NOBODY}}}}
    return kube_blocks(sim, tmp_path, unschedulable_seconds=WINDOW, job_template=template)


def one_attempt(spec: dict[str, Any], kb: dict[str, Any], run_id: str) -> tuple[Any, dict[str, Any]]:
    state = train_attempt(parse_spec(spec), attempt=1, run_id=run_id, backend_block=kb["backend_block"],
                          evidence_block=kb["evidence_block"], return_state=True)
    return state, kept(kb["evidence"], run_id, 1, "verdict.json")


def wait_lines(flow_run_id: str) -> list[tuple[int, str, str]]:
    """The attempt's lines about pods waiting to be scheduled: (seconds so far, pods, what is missing)."""
    found = [WAIT_LINE.fullmatch(m) for m in run_logs(flow_run_id)]
    return [(int(m[1]), m[2], m[3]) for m in found if m]


def test_a_pod_no_scheduler_decides_on_is_reported_while_it_waits_then_judged_unschedulable(
        kb: dict[str, Any]) -> None:
    state, verdict = one_attempt(inline("k-nobody", "print('never runs')"), kb, "k-nobody-1")
    assert state.is_failed() and verdict["category"] == "unschedulable"
    assert verdict["termination_reason"] == "Unschedulable" and verdict["decision"]["retry"] is True
    outcome = kept(kb["evidence"], "k-nobody-1", 1, "kubernetes/outcome.json")
    pod = outcome["instance"]
    assert outcome["message"] == (f"no scheduler decided on pod {pod} in 11s (schedulerName: {NOBODY}): "
                                  "is a scheduler of that name running?")
    said = wait_for(lambda: wait_lines(verdict["flow_run_id"]), timeout=20, what="the waiting lines in Prefect")
    assert {(who, missing) for _, who, missing in said} == {
        (f"pod {pod}", f"no scheduler has decided yet (schedulerName: {NOBODY})")}
    seconds = [s for s, _, _ in said]
    assert seconds == sorted(seconds) and 5 <= seconds[0] < 10 and all(s < WINDOW for s in seconds)
    # nothing from a scheduler: no FailedScheduling, no condition; the evidence shows the pod as it was
    events = kept(kb["evidence"], "k-nobody-1", 1, "kubernetes/events.json")
    assert not [e for e in events if e["reason"] in ("FailedScheduling", "Scheduled")]


def test_the_pods_of_a_two_node_attempt_no_scheduler_decides_on_are_reported_together(kb: dict[str, Any]) -> None:
    spec = inline("k-nobody2", "print('never runs')", nodes=2)
    state, verdict = one_attempt(spec, kb, "k-nobody2-1")
    assert state.is_failed() and verdict["category"] == "unschedulable"
    outcome = kept(kb["evidence"], "k-nobody2-1", 1, "kubernetes/outcome.json")
    assert re.fullmatch(rf"no scheduler decided on pod \S+ in 11s \(schedulerName: {NOBODY}\): "
                        r"is a scheduler of that name running\?", outcome["message"])
    said = wait_for(lambda: wait_lines(verdict["flow_run_id"]), timeout=20, what="the waiting lines in Prefect")
    pods = sorted(e["pod"] for e in kept(kb["evidence"], "k-nobody2-1", 1, "attempt.json")["indexes"])
    assert len(pods) == 2 and outcome["instance"] in pods
    # one line for both pods, which wait for the same thing
    assert {(who, missing) for _, who, missing in said} == {
        (f"pods {pods[0]}, {pods[1]}", f"no scheduler has decided yet (schedulerName: {NOBODY})")}
