"""The Job trainguard writes, against golden files (regenerate with TRAINGUARD_REGEN_GOLDEN=1),
plus the rules the goldens stand for and one Job run for real on kubesim."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from trainguard.core.backends.base import Launch
from trainguard.core.backends import entrypoint_archive
from trainguard.core.backends.kubernetes import indexed, manifests, zipapp
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.manifests import AttemptVolume, JobSettings
from trainguard.core.masking import SECRET_NAMES_VARIABLE
from waiting import wait_for

GOLDEN = Path(__file__).parent / "golden"
CONFIG_MAP = "trainguard-entrypoint-0123456789ab"  # fixed, so an entrypoint change leaves goldens alone
HF_TOKEN = "hf_GoldenFileValueNeverWritten01"
LAUNCH = Launch(run_id="resnet-sweep-3-1a2b3c4d", attempt=2, command=("python", "train.py", "--epochs", "90"),
                env={"WANDB_PROJECT": "sweeps", "HF_TOKEN": HF_TOKEN, "odd key!": "s3cr3t-value",
                     SECRET_NAMES_VARIABLE: "HF_TOKEN,odd key!"}, gpus=8, deadline_seconds=86400.5,
                resume_from="/trainguard/checkpoints/resnet-sweep-3-1a2b3c4d/step-000120.pt")
FULL = JobSettings(
    image="ghcr.io/acme/train:1.4", namespace="ml", image_pull_policy="IfNotPresent", image_pull_secrets=("regcred",),
    cpu_request="30", cpu_limit="32", memory_request="200Gi", memory_limit="240Gi",
    node_selector={"nvidia.com/gpu.product": "H100"},
    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    priority_class="training-high", service_account="trainer",
    volumes=({"name": "data", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},),
    volume_mounts=({"name": "data", "mountPath": "/data", "readOnly": True},),
    shm_size="64Gi", labels={"team": "vision"}, annotations={"owner": "ml-platform@example.com"},
    attempt_volume=AttemptVolume("hostPath", host_path="/mnt/trainguard"), python="/opt/conda/bin/python",
)

# A native sidecar as users add it: trainguard writes no init containers, so the list goes in as written.
SIDECAR = {"name": "shipper", "image": "fluent/fluent-bit:3.2", "restartPolicy": "Always",
           "volumeMounts": [{"name": "trainguard-attempts", "mountPath": "/trainguard/attempts", "readOnly": True}]}

TWO_NODES = Launch(run_id="r-1", attempt=1, command=("torchrun", "t.py"), gpus=2, nodes=2, processes_per_node=2)
CASES: dict[str, tuple[JobSettings, Launch]] = {
    "minimal": (JobSettings(image="python:3.11"), Launch(run_id="r-1", attempt=1, command=("python", "t.py"))),
    "full": (FULL, LAUNCH),
    "retry-after-host-oom-and-gpu-fault": (FULL, Launch(**{**LAUNCH.__dict__, "attempt": 3, "memory_factor": 1.5,
                                                           "avoid_nodes": ("gpu-node-7", "gpu-node-2")})),
    "template-override": (JobSettings(image="python:3.11", shm_size=None, attempt_volume=AttemptVolume("emptyDir"),
                                      job_template={"spec": {"ttlSecondsAfterFinished": 3600, "template": {
                                          "spec": {"runtimeClassName": "nvidia", "initContainers": [SIDECAR]}}}}),
                          Launch(run_id="r-1", attempt=1, command=("python", "t.py"))),
    # several nodes: an Indexed Job in hold mode behind a headless Service ...
    "two-nodes": (JobSettings(image="python:3.11"), TWO_NODES),
    # ... and, for a cluster before 1.29, backoffLimit 0, one pod per node, after a GPU fault on one node
    "four-nodes-fallback-one-per-node": (
        JobSettings(image="python:3.11", hold_mode=False, one_pod_per_node=True, master_port=29600),
        Launch(**{**TWO_NODES.__dict__, "attempt": 2, "nodes": 4, "avoid_nodes": ("gpu-node-7",)})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_job_matches_its_golden_file(case: str) -> None:
    settings, launch = CASES[case]
    produced = json.dumps(manifests.job_manifest(settings, launch, CONFIG_MAP), indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / f"job-{case}.json"
    if os.environ.get("TRAINGUARD_REGEN_GOLDEN") == "1":
        golden.write_text(produced)
    assert golden.exists(), f"{golden} is missing: run with TRAINGUARD_REGEN_GOLDEN=1 once and review it"
    assert produced == golden.read_text(), f"{golden.name} differs; review, then TRAINGUARD_REGEN_GOLDEN=1"


def test_the_headless_service_of_a_multi_node_attempt_matches_its_golden_file() -> None:
    job = manifests.job_manifest(*CASES["two-nodes"], CONFIG_MAP)
    job["metadata"]["uid"] = "0b6e4f9a-0000-4000-8000-000000000002"  # as the API server answers
    produced = json.dumps(indexed.service_manifest(job), indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / "service-two-nodes.json"
    if os.environ.get("TRAINGUARD_REGEN_GOLDEN") == "1":
        golden.write_text(produced)
    assert produced == golden.read_text(), f"{golden.name} differs; review, then TRAINGUARD_REGEN_GOLDEN=1"


def test_secret_env_values_go_into_the_attempts_secret_and_the_job_only_refers_to_them() -> None:
    job = manifests.job_manifest(FULL, LAUNCH, CONFIG_MAP)
    assert HF_TOKEN not in json.dumps(job) and "s3cr3t-value" not in json.dumps(job)
    assert job["spec"]["suspend"] is True  # no pod before its Secret exists
    job["metadata"]["uid"] = "0b6e4f9a-0000-4000-8000-000000000001"  # as the API server answers
    secret = manifests.secret_manifest(FULL, LAUNCH, job)
    assert secret is not None and secret["metadata"]["name"] == "tg-resnet-sweep-3-1a2b3c4d-a2-env"
    assert secret["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": "tg-resnet-sweep-3-1a2b3c4d-a2",
                                                      "uid": "0b6e4f9a-0000-4000-8000-000000000001"}]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
            if "valueFrom" in e}
    assert set(refs) == {"HF_TOKEN", "odd key!"} and refs["HF_TOKEN"]["key"] == "HF_TOKEN"
    assert refs["odd key!"]["key"].startswith("env-")  # not a valid Secret key as it is spelled
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert values == {"HF_TOKEN": HF_TOKEN, refs["odd key!"]["key"]: "s3cr3t-value"}
    assert secret["immutable"] is True
    plain = manifests.job_manifest(FULL, Launch(run_id="r", attempt=1, command=("t",), env={"A": "b"}), CONFIG_MAP)
    assert "suspend" not in plain["spec"] and manifests.secret_manifest(FULL, Launch("r", 1, ("t",)), plain) is None


def test_the_python_of_the_job_runs_the_entrypoint_and_the_evidence_collector_too() -> None:
    from trainguard.core.backends.kubernetes import collector

    for settings, python in ((CASES["minimal"][0], "python3"), (FULL, "/opt/conda/bin/python")):
        job = manifests.job_manifest(settings, LAUNCH, CONFIG_MAP)
        assert job["spec"]["template"]["spec"]["containers"][0]["command"][0] == python
        pod = collector.pod_manifest(job, collector.plan(job["spec"]["template"]["spec"]), node=None, budget_bytes=1)
        assert pod["spec"]["containers"][0]["command"][:2] == [python, "-c"]


def test_sys_ptrace_is_added_only_when_asked_and_then_the_stacks_are_native() -> None:
    def container(settings: JobSettings) -> dict[str, Any]:
        job = manifests.job_manifest(settings, LAUNCH, CONFIG_MAP)
        found: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
        return found

    plain, ptrace = container(JobSettings(image="x")), container(JobSettings(image="x", sys_ptrace=True,
                                                                              stack_sweep_seconds=12))
    assert "securityContext" not in plain
    assert ptrace["securityContext"] == {"capabilities": {"add": ["SYS_PTRACE"]}}
    env = {item["name"]: item.get("value") for item in ptrace["env"]}
    assert (env["TRAINGUARD_STACK_NATIVE"], env["TRAINGUARD_STACK_SWEEP_SECONDS"]) == ("1", "12")
    assert {item["name"]: item.get("value") for item in plain["env"]}["TRAINGUARD_STACK_NATIVE"] == "0"


def test_the_pods_grace_gains_the_stack_sweep_so_the_stacks_do_not_eat_the_commands_own() -> None:
    def pod(settings: JobSettings) -> dict[str, Any]:
        found: dict[str, Any] = manifests.job_manifest(settings, LAUNCH, CONFIG_MAP)["spec"]["template"]["spec"]
        return found

    assert pod(JobSettings(image="x", stack_sweep_seconds=12.5))["terminationGracePeriodSeconds"] == 30 + 13
    assert pod(JobSettings(image="x", stack_sweep_seconds=0))["terminationGracePeriodSeconds"] == 30


def test_the_specs_notice_grace_sets_the_pods_and_the_entrypoint_gives_it_after_the_sweep() -> None:
    # the kubelet's SIGTERM reaches the entrypoint with the pod's whole grace left; after the stacks
    # (at most the sweep) it gives notice with the spec's grace to go: never past the SIGKILL
    launch = Launch(**{**LAUNCH.__dict__, "notice_grace_seconds": 90.5})
    spec = manifests.job_manifest(JobSettings(image="x", stack_sweep_seconds=20), launch, CONFIG_MAP)
    pod = spec["spec"]["template"]["spec"]
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    assert pod["terminationGracePeriodSeconds"] == 91 + 20
    assert env["TRAINGUARD_NOTICE_GRACE_SECONDS"] == "91"
    assert "preStop" not in json.dumps(pod)  # nothing takes a share of the grace before the SIGTERM


def test_the_job_never_retries_by_itself_and_fails_fast_on_hopeless_exit_codes() -> None:
    job = manifests.job_manifest(*CASES["full"], CONFIG_MAP)
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 86401
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == [2, 126, 127]
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["/opt/conda/bin/python", "/trainguard/entrypoint/trainguard-entrypoint.pyz", "--"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_names_are_deterministic_valid_and_unique_per_attempt() -> None:
    long_run = "a" * 42 + "-1a2b3c4d"
    names = {manifests.job_name(run, attempt) for run in ("r-1", long_run, long_run + "x") for attempt in (1, 2)}
    assert len(names) == 6 and all(len(n) <= 52 and n[0].isalpha() for n in names)
    assert manifests.job_name("r-1", 1) == manifests.job_name("r-1", 1) == "tg-r-1-a1"


@pytest.mark.parametrize(("quantity", "factor", "scaled"), [
    ("16Gi", 1.5, str(24 * 2**30)), ("512Mi", 2.0, str(2**30)), ("1G", 1.25, "1250000000"), ("100", 1.0, "100"),
])
def test_memory_is_scaled_by_the_factor(quantity: str, factor: float, scaled: str) -> None:
    assert manifests.scale_quantity(quantity, factor) == scaled


def test_a_bad_memory_quantity_is_one_line_naming_it() -> None:
    with pytest.raises(ValueError, match="memory '16 gigs'"):
        manifests.scale_quantity("16 gigs", 2.0)


def test_the_entrypoint_zipapp_is_reproducible() -> None:
    entrypoint_archive.build.cache_clear()
    first = entrypoint_archive.build()
    entrypoint_archive.build.cache_clear()
    assert entrypoint_archive.build() == first and zipapp.config_map_name().startswith("trainguard-entrypoint-")


def _run_job(kube: KubeApi, ns: str, settings: JobSettings, launch: Launch) -> dict[str, Any]:
    cm = zipapp.config_map(ns)
    kube.create_config_map(ns, cm)
    kube.create_job(ns, manifests.job_manifest(settings, launch, cm["metadata"]["name"]))
    sel = manifests.selector(launch.run_id, launch.attempt)
    return wait_for(lambda: next((p for p in kube.list_pods(ns, sel)["items"]
                                  if p["status"].get("phase") in ("Succeeded", "Failed")), None),
                    timeout=30, what="the training pod to end")


def test_the_job_runs_the_command_under_the_zipapp_and_keeps_off_avoided_nodes(kube: KubeApi, ns: str) -> None:
    settings = JobSettings(image="python:3.11", namespace=ns, memory_limit="1Gi")
    script = "import os; print('ckpt', os.environ['TRAINGUARD_CHECKPOINT_DIR']); raise SystemExit(3)"
    launch = Launch(run_id="r-zip", attempt=1, command=("python", "-c", script), avoid_nodes=("gpu-node-1",), gpus=1)
    pod = _run_job(kube, ns, settings, launch)
    assert pod["spec"]["nodeName"] == "gpu-node-2"
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    summary = json.loads(state["message"])
    assert state["exitCode"] == 3 and summary["exit_code"] == 3
    assert summary["log_tail"][0] == "ckpt /trainguard/checkpoints/r-zip"
    assert summary["crash_report"] == "/trainguard/attempts/runs/r-zip/attempt-1/crash-report.json"
