"""The shared avoid list (the Prefect Variable) honoured by an attempt's Kubernetes Job on kubesim.

kubesim's request log records each call (verb, resource, namespace) but not its body: it shows the
flow listing the nodes before it creates the Job; the Job's affinity is read back from the API and
the pod's node from where kubesim's scheduler put it. The GPUs are kubesim's advertised ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefect.variables import Variable

from simfixtures import sim_fixture
from kube_helpers import inline, kept, kube_blocks
from trainguard.core.fleet.avoid import VARIABLE
from trainguard.core.spec import parse_spec

sim = sim_fixture()
LATER, EARLIER = "2099-01-01T00:00:00Z", "2020-01-01T00:00:00Z"


@pytest.fixture
def kb(sim: Any, prefect_server: str, tmp_path: Any) -> dict[str, Any]:
    yield kube_blocks(sim, tmp_path, start_error_seconds=1, unschedulable_seconds=2)
    Variable.unset(VARIABLE)


def attempt(kb: dict[str, Any], run_id: str) -> tuple[Any, dict[str, Any]]:
    from flows.attempt import train_attempt

    # a code error: the failed Job is kept (its TTL), so its affinity can be read back
    spec = inline("k-avoid", "import sys; print('step 1/1', flush=True); sys.exit(3)", retry={"max_total_attempts": 1})
    state = train_attempt(parse_spec(spec), attempt=1, run_id=run_id, backend_block=kb["backend_block"],
                          evidence_block=kb["evidence_block"], return_state=True)
    return state, kept(kb["evidence"], run_id, 1, "verdict.json")


def entry(node: str, expires_at: str) -> dict[str, str]:
    return {"node": node, "reason": "3 gpu_fault in 12 attempts", "expires_at": expires_at, "added_by": "test"}


def job_affinity(sim: Any, kb: dict[str, Any], run_id: str) -> Any:
    job = kb["api"].batch.read_namespaced_job(f"tg-{run_id}-a1", kb["namespace"])
    return job.spec.template.spec.affinity


def test_the_job_keeps_off_an_avoided_node_and_an_expired_entry_is_ignored(sim: Any, kb: dict[str, Any]) -> None:
    Variable.set(VARIABLE, [entry("gpu-node-1", LATER), entry("gpu-node-2", EARLIER)], overwrite=True)
    sim.clear_requests()

    state, verdict = attempt(kb, "k-avoid-1")

    assert state.is_failed(), state.message
    calls = [(r["verb"], r["resource"]) for r in sim.requests() if r["resource"] in ("nodes", "jobs")]
    assert calls.index(("list", "nodes")) < calls.index(("create", "jobs"))
    terms = job_affinity(sim, kb, "k-avoid-1").node_affinity.required_during_scheduling_ignored_during_execution
    (requirement,) = terms.node_selector_terms[0].match_fields
    assert (requirement.key, requirement.operator, requirement.values) == ("metadata.name", "NotIn", ["gpu-node-1"])
    assert verdict["node"] == "gpu-node-2"
    assert [e["node"] for e in verdict["avoid_list"]] == ["gpu-node-1"] and verdict["avoid_note"] == ""


def test_an_avoid_list_that_leaves_no_node_is_not_applied_and_the_verdict_says_so(sim: Any, kb: dict[str, Any]) -> None:
    Variable.set(VARIABLE, [entry("gpu-node-1", LATER), entry("gpu-node-2", LATER)], overwrite=True)

    state, verdict = attempt(kb, "k-avoid-2")

    assert state.is_failed(), state.message
    assert job_affinity(sim, kb, "k-avoid-2") is None
    assert sorted(e["node"] for e in verdict["avoid_list"]) == ["gpu-node-1", "gpu-node-2"]
    assert "would leave 0 of 2 nodes" in verdict["avoid_note"] and "ran anyway" in verdict["avoid_note"]


def test_an_entry_naming_no_node_is_recorded_not_applied_and_the_attempt_runs(sim: Any, kb: dict[str, Any]) -> None:
    Variable.set(VARIABLE, [entry("gpu-b (ECC, RMA 4411)", LATER), entry("gpu-node-1", LATER)], overwrite=True)

    state, verdict = attempt(kb, "k-avoid-3")

    assert state.is_failed() and verdict["exit_code"] == 3, state.message  # it ran: the command's own exit
    terms = job_affinity(sim, kb, "k-avoid-3").node_affinity.required_during_scheduling_ignored_during_execution
    assert [r.values for r in terms.node_selector_terms[0].match_fields] == [["gpu-node-1"]]
    assert verdict["node"] == "gpu-node-2"
    assert "'gpu-b (ECC, RMA 4411)'" in verdict["avoid_note"] and "not applied" in verdict["avoid_note"]
