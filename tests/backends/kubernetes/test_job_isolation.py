"""What one training job can reach of the cluster and of other runs, on kubesim's real mounts.

A training pod gets its own attempt folder (a subPath of the attempts volume), its own run's
checkpoint folder, and no service-account token unless the block asks for one: it cannot read
another run's raw log (which may hold secrets), rewrite it, plant a symlink where another run's
collector will look, or call the Kubernetes API as the namespace's default account.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import kubesim.fixture
from rbac_check import allowed_by_rbac, calls
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes import manifests
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core.masking import SECRET_NAMES_VARIABLE
from waiting import wait_for

TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
HF = "hf_Zq8xkWm3TT0pLxYVbn2cRs4u"
OPAQUE = "opaque-db-secret-value-77"  # a value no pattern knows: masked because secret_env declared it
SECRET_ENV = {"HF_TOKEN": HF, "DB_URL_PART": OPAQUE, "WANDB_PROJECT": "sweeps",
              SECRET_NAMES_VARIABLE: "DB_URL_PART,HF_TOKEN"}
_DIGEST = hashlib.sha256((HF + OPAQUE).encode()).hexdigest()  # the command names no secret itself
READS_THEM = ("import hashlib, os\n"
              "seen = hashlib.sha256((os.environ['HF_TOKEN'] + os.environ['DB_URL_PART']).encode()).hexdigest()\n"
              f"print('secrets arrived' if seen == {_DIGEST!r} else 'secrets missing', os.environ['WANDB_PROJECT'],"
              " flush=True)\n")


def backend(kube: KubeApi, ns: str, tmp_path: Path, **job: Any) -> KubernetesBackend:
    return KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns, **job),
                                                        local_root=str(tmp_path)))


def run(b: KubernetesBackend, run_id: str, code: str, **fields: Any) -> Any:
    return b.run(b.provision(run_id, 1), Launch(run_id=run_id, attempt=1, command=("python", "-c", code), **fields))


def test_the_training_pod_gets_no_service_account_token_unless_the_block_asks_for_one(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    code = f"import os; print('token mounted' if os.path.exists({TOKEN!r}) else 'no token')"
    plain = run(backend(kube, ns, tmp_path), "r-token", code)
    assert plain.succeeded and "no token" in plain.log_tail.splitlines()
    asked = run(backend(kube, ns, tmp_path, automount_service_account_token=True), "r-token-asked", code)
    assert asked.succeeded and "token mounted" in asked.log_tail.splitlines()


def test_a_job_cannot_read_rewrite_or_plant_in_another_runs_attempt_folder(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    victim, attacker = f"victim-{uuid.uuid4().hex[:6]}", f"attacker-{uuid.uuid4().hex[:6]}"
    b = backend(kube, ns, tmp_path)
    assert run(b, victim, "print('HF_TOKEN=hf_victimsecretvalue123456', flush=True)").succeeded
    volume = sim.root / "pvc" / ns / "trainguard-attempts" / "runs"
    victim_log = volume / victim / "attempt-1" / "logs" / f"train-{victim}-attempt-1.log"
    assert b"hf_victimsecretvalue" in victim_log.read_bytes()  # the raw log keeps what was printed
    code = ("import os\n"
            f"theirs = os.environ['TRAINGUARD_WORKSPACE'].replace({attacker!r}, {victim!r})\n"
            f"log = theirs + '/logs/train-{victim}-attempt-1.log'\n"
            "try:\n    print('read:', open(log).read()); open(log, 'a').write('rewritten')\n"
            "except OSError as exc:\n    print('read failed:', type(exc).__name__)\n"
            "print('their folder holds:', sorted(os.listdir(theirs)) if os.path.isdir(theirs) else [], flush=True)\n"
            "plant = os.path.dirname(theirs) + '/attempt-2'\n"
            "try:\n    os.makedirs(os.path.dirname(plant), exist_ok=True); os.symlink('/etc', plant)\n"
            "except OSError as exc:\n    print('plant failed:', type(exc).__name__)\n")
    plant = Path(f"/trainguard/attempts/runs/{victim}/attempt-2")
    try:
        outcome = run(b, attacker, code)
    finally:
        if plant.is_symlink():  # made in the container's view of the host, not on the volume
            plant.unlink()
    assert outcome.succeeded, outcome.message
    assert "hf_victimsecretvalue" not in outcome.log_tail and "read failed: FileNotFoundError" in outcome.log_tail
    assert "their folder holds: []" in outcome.log_tail  # (kubesim leaves empty mount targets on the host)
    assert b"rewritten" not in victim_log.read_bytes()
    assert sorted(os.listdir(volume / victim)) == ["attempt-1"]  # nothing planted beside it
    assert (volume / attacker / "attempt-1" / "logs" / f"train-{attacker}-attempt-1.log").is_file()


def secret_of(kube: KubeApi, ns: str, name: str) -> Any:
    found = kube.core.list_namespaced_secret(ns, field_selector=f"metadata.name={name}").items
    return found[0] if found else None


def test_secret_env_travels_in_a_secret_the_job_owns_never_in_the_job_or_its_pods(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    b = backend(kube, ns, tmp_path)
    sim.clear_requests()
    ref = b.provision("r-secret", 1)
    outcome = b.run(ref, Launch(run_id="r-secret", attempt=1, command=("python", "-c", READS_THEM), env=SECRET_ENV))
    assert outcome.succeeded and "secrets arrived sweeps" in outcome.log_tail
    made = calls(sim, ns)
    assert (ns, "secrets", "create") in made and made <= allowed_by_rbac(ns), made - allowed_by_rbac(ns)
    job = kube.read_job(ns, ref.name)
    pods = kube.list_pods(ns, manifests.selector("r-secret", 1))["items"]
    stored = json.dumps([job, pods])
    assert HF not in stored and OPAQUE not in stored  # what `get jobs`, `get pods`, etcd and audit logs see
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    name = manifests.secret_name("r-secret", 1)
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "HF_TOKEN"}}}
    assert env["WANDB_PROJECT"] == {"name": "WANDB_PROJECT", "value": "sweeps"}
    secret = secret_of(kube, ns, name)
    owner = secret.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid) == ("Job", ref.name, job["metadata"]["uid"])
    assert secret.immutable is True and set(secret.data) == {"HF_TOKEN", "DB_URL_PART"}
    b.release(ref)  # a succeeded Job is deleted; its Secret goes with it
    wait_for(lambda: secret_of(kube, ns, name) is None, what="the attempt's Secret deleted with its Job")


def test_a_flow_killed_between_the_job_and_its_secret_leaves_a_job_that_waits_and_is_adopted(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    b = backend(kube, ns, tmp_path)
    ref = b.provision("r-half", 1)
    launch = Launch(run_id="r-half", attempt=1, command=("python", "-c", READS_THEM), env=SECRET_ENV)
    # what a flow process leaves when it dies right after creating the Job
    kube.create_job(ns, manifests.job_manifest(b.settings.job, launch, ref.details["config_map"]))
    assert kube.read_job(ns, ref.name)["spec"]["suspend"] is True
    assert not kube.list_pods(ns, manifests.selector("r-half", 1))["items"]  # nothing runs without its secrets
    outcome = b.run(ref, launch)  # the flow run started again adopts the Job
    assert outcome.succeeded and "secrets arrived sweeps" in outcome.log_tail
    again = b.run(ref, launch)  # and once more, with both already there
    assert again.succeeded
