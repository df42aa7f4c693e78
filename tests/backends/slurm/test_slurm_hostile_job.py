"""A Slurm attempt of two tasks whose job attacks the evidence collector: it still ends as its own code error.

Each task runs the entrypoint under srun on the real single-node cluster; both plant links to a
host file, FIFOs, a device, a 10 TB sparse file and names with terminal escapes in their folders
(task 0 in the attempt's folder, task 1 in `tasks/1`), print a secret, and fail with a TypeError.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hostile import HOSTILE_TRAINER, SECRET, check_evidence, host_file, within

from trainguard.core import triage
from trainguard.core.backends.base import Launch
from trainguard.core.backends.slurm.backend import SlurmBackend
from trainguard.core.backends.slurm.client import SlurmClient
from trainguard.core.backends.slurm.job import JobSettings
from trainguard.core.stores.folder import LocalEvidenceStore


def test_a_two_task_job_that_plants_links_fifos_devices_and_escapes_ends_as_its_code_error_with_every_task_masked(
    slurm_node_up, tmp_path: Path,
) -> None:
    secret_file = host_file(tmp_path / "host")
    backend = SlurmBackend(tmp_path / "shared", settings=JobSettings(ntasks_per_node=2),
                           client=SlurmClient(env=slurm_node_up.env), poll_max_seconds=0.5)
    ref = backend.provision("hostile-slurm-1", 1)
    planted = tmp_path / "planted"
    planted.mkdir()
    launch = Launch("hostile-slurm-1", 1, (sys.executable, "-c", HOSTILE_TRAINER, str(secret_file), str(planted)),
                    env={"HF_TOKEN": SECRET}, deadline_seconds=300)
    started = time.monotonic()

    outcome = within(240, lambda: backend.run(ref, launch, on_line=lambda line: None), "the job to end")

    # Both tasks fail with exit code 1; when one fails first, srun may end the other with SIGTERM
    # (143) before it fails on its own, and the job's exit code is the highest of its tasks'.
    assert outcome.reason == "Error" and outcome.exit_code in (1, 143), outcome.message
    assert time.monotonic() - started < 120, "the entrypoints must not wait on the job's FIFOs or devices"
    store = LocalEvidenceStore(tmp_path / "evidence")
    manifest = within(120, lambda: backend.collect_evidence(ref, store, outcome), "the evidence").manifest
    diagnosis = within(60, lambda: triage.classify(backend.signals(ref, outcome)), "triage")
    assert diagnosis.category == "code_error", diagnosis
    check_evidence(manifest, store, tmp_path / "evidence", "runs/hostile-slurm-1/attempt-1")
    names = {item.name for item in manifest.items}
    assert {"tasks/1/crash-report.json", "tasks/1/snapshot/env.json",
            "tasks/1/coredumps/%1B[31mred%E2%80%AEexe.core"} <= names, names
    task_log = next(name for name in names if name.startswith("tasks/1/logs/"))
    assert "rank 1 HF_TOKEN=***" in store.get_bytes(f"runs/hostile-slurm-1/attempt-1/{task_log}").decode()
    out = next(name for name in names if name.startswith("slurm/slurm-") and name.endswith(".out"))
    assert "HF_TOKEN=***" in store.get_bytes(f"runs/hostile-slurm-1/attempt-1/{out}").decode()
    reasons = {item.name: item.reason for item in manifest.missing}
    assert "symbolic link" in reasons["tasks/1/coredumps/core.leak"] and "FIFO" in reasons["tasks/1/coredumps/core.pipe"]
    assert "apparent size" in reasons["tasks/1/coredumps/core.sparse"]
    assert "hard link" in reasons["tasks/1/snapshot/hardlink.json"]
    assert [Path(p).name for p in within(30, lambda: backend.checkpoints("hostile-slurm-1"), "checkpoints")] == [
        "step-000001.pt"]
