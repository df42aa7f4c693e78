"""The training-run driver end to end: real flows, processes, evidence and triage.

The retry policy's outcomes do not depend on where training runs, so those tests run on both the
local-process backend and the Kubernetes backend (against kubesim); the rest on one machine.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from prefect import get_client
from prefect.artifacts import Artifact
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

from flow_helpers import attempt_dir, attempt_runs, run, tiny_spec
from simfixtures import sim_fixture
from kube_helpers import kube_blocks

from trainguard.core.evidence.manifest import read_manifest, verify_manifest
from trainguard.core.stores.folder import LocalEvidenceStore


sim = sim_fixture()


@pytest.fixture(params=["local", "kubernetes"])
def either(request: pytest.FixtureRequest, blocks: dict, tmp_path: Any) -> dict:
    """The blocks of one backend, and the Python its training command runs with."""
    if request.param == "local":
        return {**blocks, "name": "local", "python": sys.executable}
    sim = request.getfixturevalue("sim")
    return {**kube_blocks(sim, tmp_path), "name": "kube", "python": "python"}  # the image's Python


def on(backend: dict, spec: dict) -> dict:
    """``spec`` with its command run by the backend's Python."""
    return {**spec, "command": [backend["python"], *spec["command"][1:]]}


def test_a_retryable_failure_is_retried_from_its_checkpoint_and_succeeds(blocks, monkeypatch):
    # secrets come by reference, from the worker's environment (a spec's env refuses them)
    monkeypatch.setenv("PLANTED_WANDB", "planted-secret-4242")
    monkeypatch.setenv("PLANTED_HUB", "https://bob:pw-99@hub.local/x")
    spec = tiny_spec("nccl-then-ok", "--fail-at-step", "35", "--fail-on-attempt", "1",
                     secret_env={"WANDB_API_KEY": "env:PLANTED_WANDB", "HUB_URL": "env:PLANTED_HUB"})
    state, history = run(spec, blocks, "nccl-then-ok-1")

    assert state.is_completed(), state.message
    assert [(h["state"], h["category"]) for h in history] == [("Failed", "nccl_error"), ("Completed", None)]
    assert "Watchdog caught collective operation timeout" in history[0]["signature"]
    assert history[1]["resumed_from"].endswith("step-000030.json")
    runs = attempt_runs("nccl-then-ok-1")
    assert [r.name for r in runs] == ["nccl-then-ok-a1", "nccl-then-ok-a2"]

    second = attempt_dir(blocks["evidence"], "nccl-then-ok-1", 2)
    log2 = next((second / "logs").glob("train-*.log")).read_text()
    assert "attempt 2: resumed from step 30" in log2  # what the script itself reports

    first = attempt_dir(blocks["evidence"], "nccl-then-ok-1", 1)
    assert "Watchdog caught collective operation timeout" in (first / "crash-tail.txt").read_text()
    env = (first / "snapshot" / "env.json").read_text()
    assert "planted-secret-4242" not in env and "pw-99" not in env
    assert json.loads(env)["variables"]["WANDB_API_KEY"] == "***"
    report = json.loads((first / "crash-report.json").read_text())
    assert report["exit_code"] == 1
    assert "step-000030.json" in (first / "checkpoints.json").read_text()
    report_md = Artifact.get("nccl-then-ok-1-attempt-1").data
    for expected in ("nccl_error", "retryable | yes", "nccl.", "GPU-seconds", "step-000030.json", "attempt-1"):
        assert expected in report_md.replace("\\_", "_"), expected  # Markdown escapes the underscores
    assert len(json.loads(Artifact.get("nccl-then-ok-1-attempts").data)) == 2  # the table of all attempts
    # a folder store's items are fetched by command: no browser opens a file:// link from the UI
    assert "file://" not in report_md
    assert "trainguard evidence get nccl-then-ok-1 1 crash-report.json -o crash-report.json --root " in report_md
    # the parent training-run flow run, which the UI shows first, carries the run report too
    with get_client(sync_client=True) as client:
        on_parent = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["nccl-then-ok-1-report"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    assert on_parent and "Run nccl-then-ok-1" in str(on_parent[0].data), on_parent

    store = LocalEvidenceStore(blocks["evidence"])
    for attempt in (1, 2):
        manifest = read_manifest(store, "nccl-then-ok-1", attempt)
        assert manifest.items and verify_manifest(store, manifest) == []


def test_a_code_error_fails_fast_with_exactly_one_attempt(either):
    run_id = f"type-error-{either['name']}"
    spec = on(either, tiny_spec("type-error", "--fail-after-steps", "3", "--failure", "type-error"))
    state, history = run(spec, either, run_id)

    assert state.is_failed()
    assert len(history) == 1 and history[0]["category"] == "code_error"
    assert "not retryable" in history[0]["decision"]["reason"]
    runs = attempt_runs(run_id)
    assert len(runs) == 1 and runs[0].state.is_failed()
    assert "code_error" in runs[0].state.message


def test_an_always_retryable_failure_without_checkpoint_progress_uses_exactly_the_attempt_budget(either):
    # no checkpoint within the 15 steps of an attempt: each attempt spends the budget
    spec = on(either, tiny_spec("budget", "--fail-after-steps", "15", "--checkpoint-every", "100",
                                retry={"max_attempts": 3, "same_signature_limit": 0}))
    state, history = run(spec, either, run_id := f"budget-{either['name']}")

    assert state.is_failed()
    assert [h["category"] for h in history] == ["nccl_error"] * 3
    assert "budget spent: 3 of 3" in history[-1]["decision"]["reason"]
    assert len(attempt_runs(run_id)) == 3


def test_the_same_signature_twice_trips_the_circuit_breaker_early(either):
    spec = on(either, tiny_spec("breaker", "--fail-after-steps", "15", retry={"max_attempts": 5}))
    state, history = run(spec, either, f"breaker-{either['name']}")

    assert state.is_failed() and len(history) == 2
    assert "circuit breaker: the same failure signature repeated 2 times" in history[-1]["decision"]["reason"]
    assert history[0]["fingerprint"] == history[1]["fingerprint"]


def test_a_native_crash_records_signal_139_and_keeps_the_core_dump_when_the_machine_allows(blocks):
    spec = tiny_spec("segv", "--fail-after-steps", "3", "--failure", "segfault", retry={"max_total_attempts": 1})
    state, history = run(spec, blocks, "segv-1")

    assert state.is_failed()
    assert history[0]["exit_code"] == 139 and history[0]["category"] == "native_crash"
    evidence = attempt_dir(blocks["evidence"], "segv-1", 1)
    report = json.loads((evidence / "crash-report.json").read_text())
    assert report["signal"] == 11 and report["exit_code"] == 139
    manifest = read_manifest(LocalEvidenceStore(blocks["evidence"]), "segv-1", 1)
    cores = [item for item in manifest.items if item.name.startswith("coredumps/")]
    if not cores:
        absent = [m for m in manifest.missing if m.name.startswith("coredumps")]
        assert absent and absent[0].reason, "the manifest must say why no core was kept"
        pytest.skip(f"this machine keeps no core dumps ({absent[0].reason}); the manifest says so")
    assert cores[0].size_bytes > 0


def test_a_hung_attempt_is_ended_by_the_stall_window_classified_timeout_and_its_evidence_kept(either):
    spec = on(either, tiny_spec("stall", "--fail-after-steps", "12", "--failure", "hang", stall_seconds=2,
                                retry={"max_total_attempts": 1}))
    state, history = run(spec, either, run_id := f"stall-{either['name']}")

    assert state.is_failed()
    assert history[0]["category"] == "timeout" and history[0]["termination_reason"] == "Stalled"
    assert 2 <= history[0]["duration_seconds"] < 30  # the stalled seconds held the GPU: they count
    evidence = attempt_dir(either["evidence"], run_id, 1)
    assert "injecting failure 'hang'" in (evidence / "crash-tail.txt").read_text()
    if either["name"] == "local":  # the entrypoint's own supervisor ended it
        assert "stall window" in (evidence / "runner.json").read_text()
    else:  # the backend's supervisor, watching the pod's log, ended the Job
        assert "no new log output within stall_seconds" in (evidence / "kubernetes" / "outcome.json").read_text()


def test_attempt_flow_runs_carry_the_lineage_tags_and_their_task_runs_only_the_callers(blocks):
    # the lineage tags name one run, so no concurrency limit can use them, and each tag on a task run
    # costs a concurrency-slot round trip before it starts; a caller's own tag (a limit's) stays on them
    from prefect import tags
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with tags("gpu-pool"):
        state, history = run(tiny_spec("tagged"), blocks, "tagged-1")
    assert state.is_completed(), state.message
    (attempt,) = attempt_runs("tagged-1")
    assert set(attempt.tags) == {"trainguard-run:tagged-1", "attempt:1", "gpu-pool"}
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[attempt.id])))
    names = {task.name.rsplit("-", 1)[0] for task in tasks}
    assert {"run_training", "collect_evidence", "release_attempt"} <= names, names
    assert {tuple(sorted(task.tags)) for task in tasks} == {("gpu-pool",)}
