"""What a hostile or careless training job leaves cannot steer, break or leak through the evidence.

Each scenario runs the Job trainguard writes on kubesim (the real client, the real entrypoint, the
real collector pod), lets the job leave what an attacker or an unlucky script would, then freezes
the evidence and checks what was kept. Nothing is patched.
"""

from __future__ import annotations

from pathlib import Path

from evidence_helpers import Kept, job_failed, trainguard_job

from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.evidence import collect_kubernetes_evidence, read_triage_facts
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.taxonomy import Category
from trainguard.core.triage import classify
from waiting import wait_for

CUDA_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.15 GiB of which 1.2 GiB is free.")


def _collect(kube: KubeApi, ns: str, job: str, tmp_path: Path, run_id: str = "run-1") -> Kept:
    store = LocalEvidenceStore(tmp_path / "evidence")
    manifest = collect_kubernetes_evidence(kube, ns, job, run_id, 1, store, log_dir=tmp_path / "triage",
                                           collector_timeout_seconds=30)
    return Kept(store, manifest)


def _failed(kube: KubeApi, ns: str, name: str) -> None:
    wait_for(lambda: job_failed(kube, ns, name), timeout=30, what=f"Job {name} Failed")


def test_triage_reads_the_entrypoints_log_not_the_first_file_a_job_put_under_logs(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    script = ("import os, pathlib\n"
              "logs = pathlib.Path(os.environ['TRAINGUARD_WORKSPACE']) / 'logs'\n"
              "logs.mkdir(parents=True, exist_ok=True)\n"
              "for name in ('a.log', 'metrics.log'):\n"
              "    (logs / name).write_text('epoch 2 acc 0.62\\n')\n"
              f"print({CUDA_OOM!r}, flush=True)\n"
              "raise SystemExit(1)\n")
    job = trainguard_job(kube, ns, script)
    _failed(kube, ns, job)

    kept = _collect(kube, ns, job, tmp_path)

    assert b"epoch 2 acc" in kept.read("logs/metrics.log")  # kept as evidence, but not what decides
    facts = read_triage_facts(kept.store, "run-1", 1, tmp_path / "triage")
    assert facts.log_item == "logs/train-run-1-attempt-1.log"
    assert classify(facts.signals()).category is Category.CUDA_OOM
    assert b"CUDA out of memory" in kept.read("crash-tail.txt")
