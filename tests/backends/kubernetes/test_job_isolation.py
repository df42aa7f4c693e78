"""What one training job can reach of the cluster and of other runs, on kubesim's real mounts.

A training pod gets its own attempt folder (a subPath of the attempts volume), its own run's
checkpoint folder, and no service-account token unless the block asks for one: it cannot read
another run's raw log (which may hold secrets), rewrite it, plant a symlink where another run's
collector will look, or call the Kubernetes API as the namespace's default account.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import kubesim.fixture
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings

TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


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
