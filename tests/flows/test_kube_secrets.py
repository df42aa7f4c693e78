"""A run's secret_env on Kubernetes, through the attempt flow against kubesim: the value reaches the
training command through the attempt's own Secret, and nothing trainguard keeps or shows holds it
(the Job and its pods, the evidence, the flow run's logs), with every call inside rbac.yaml."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from pathlib import Path
from typing import Any

import pytest

from kube_helpers import inline, kube_blocks, run_logs
from rbac_check import allowed_by_rbac, calls
from simfixtures import sim_fixture
from flows.attempt import train_attempt
from trainguard.core.backends.kubernetes import manifests
from trainguard.core.spec import parse_spec
from waiting import wait_for

sim = sim_fixture()
OPAQUE = "opaque-heron-canvas-5512"  # no rule knows its shape: only the resolved secret_env masks it


@pytest.fixture
def kb(sim: Any, prefect_server: str, tmp_path: Path) -> dict[str, Any]:
    return kube_blocks(sim, tmp_path)


def test_secret_env_reaches_the_command_through_its_secret_and_is_kept_or_shown_nowhere(
    kb: dict[str, Any], sim: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TG_TEST_NOTE_SOURCE", OPAQUE)  # a variable of the worker's environment
    code = ("import os, sys\n"
            "note = os.environ['RUN_NOTE']\n"
            "print('using', note, 'len', len(note), flush=True)\n"
            "raise RuntimeError('cannot log in with ' + note)\n")
    spec = inline("k-secret", code, secret_env={"RUN_NOTE": "env:TG_TEST_NOTE_SOURCE"})
    ns = kb["namespace"]
    sim.clear_requests()
    state = train_attempt(parse_spec(spec), attempt=1, run_id="k-secret-1", backend_block=kb["backend_block"],
                          evidence_block=kb["evidence_block"], return_state=True)
    assert state.is_failed()
    made = calls(sim, ns)
    assert (ns, "secrets", "create") in made and made <= allowed_by_rbac(ns), made - allowed_by_rbac(ns)
    job = kb["api"].read_job(ns, manifests.job_name("k-secret-1", 1))  # a failed Job is kept for its TTL
    pods = kb["api"].list_pods(ns, manifests.selector("k-secret-1", 1))["items"]
    assert OPAQUE not in json.dumps([job, pods])
    evidence = kb["evidence"] / "runs" / "k-secret-1" / "attempt-1"
    log = next(evidence.glob("kubernetes/pods/*/logs/train.log")).read_text()
    assert f"using *** len {len(OPAQUE)}" in log  # the command had the value; the evidence masks it
    leaks = [str(p) for p in evidence.rglob("*") if p.is_file() and OPAQUE.encode() in p.read_bytes()]
    assert not leaks, leaks
    verdict = json.loads((evidence / "verdict.json").read_text())
    wait_for(lambda: any("cannot log in with" in m for m in run_logs(verdict["flow_run_id"])), timeout=20,
             what="the live log in Prefect")
    assert not [m for m in run_logs(verdict["flow_run_id"]) if OPAQUE in m]


def test_evidence_a_recovery_collects_for_a_dead_attempt_masks_its_secret_env_too(
    kb: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blocks import load_backend
    from flows.recovery import AttemptRun, recover_crashed
    from trainguard.core.backends.base import Launch
    from trainguard.core.masking import SECRET_NAMES_VARIABLE

    value = f"opaque-{uuid.uuid4().hex}"  # this process has never seen it: only recovery can learn it
    monkeypatch.setenv("TG_TEST_RECOVERY_SOURCE", value)
    spec = inline("k-rec", "import os; print('with', os.environ['RUN_NOTE'], flush=True); raise SystemExit(3)",
                  secret_env={"RUN_NOTE": "env:TG_TEST_RECOVERY_SOURCE"})
    backend: Any = load_backend(kb["backend_block"])
    ref = backend.provision("k-rec-1", 1)
    # what run_training hands the backend; then the flow process dies before it collects anything
    env = {"RUN_NOTE": value, SECRET_NAMES_VARIABLE: "RUN_NOTE"}
    assert backend.run(ref, Launch(run_id="k-rec-1", attempt=1, command=tuple(spec["command"]), env=env)).exit_code == 3
    params = {"spec": spec, "run_id": "k-rec-1", "attempt": 1, "backend_block": kb["backend_block"],
              "evidence_block": kb["evidence_block"]}
    dead = SimpleNamespace(id=uuid.uuid4(), name="k-rec-1-a1", start_time=None)  # its flow run, as the API gives it
    found = recover_crashed(AttemptRun(params, dead.id), dead, "the flow pod was killed")
    assert found.evidence_items and found.category == "preempted"
    evidence = kb["evidence"] / "runs" / "k-rec-1" / "attempt-1"
    assert "with ***" in next(evidence.glob("kubernetes/pods/*/logs/train.log")).read_text()
    assert not [str(p) for p in evidence.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
