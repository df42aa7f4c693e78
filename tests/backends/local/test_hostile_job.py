"""A local attempt whose job attacks the evidence collector: it still ends as its own code error, promptly.

The job (tests/hostile.py) plants links to a host file, FIFOs, a device, a 10 TB sparse file and
names with terminal escapes in its folders, then fails with a TypeError. Everything runs for real:
the local backend starts the entrypoint, the collector freezes the folder into an evidence folder,
triage reads the log, the backend lists the run's checkpoints for the next attempt.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hostile import HOSTILE_TRAINER, SECRET, check_evidence, host_file, within

from trainguard.core import triage
from trainguard.core.backends.base import Launch
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.stores.folder import LocalEvidenceStore


def test_a_job_that_plants_links_fifos_devices_sparse_files_and_escapes_ends_as_its_code_error_promptly(tmp_path: Path) -> None:
    secret = host_file(tmp_path / "host")
    backend = LocalBackend(tmp_path / "work", grace_seconds=2.0)
    ref = backend.provision("hostile-1", 1)
    launch = Launch("hostile-1", 1, (sys.executable, "-c", HOSTILE_TRAINER, str(secret)), env={"HF_TOKEN": SECRET},
                    deadline_seconds=120)
    started = time.monotonic()

    outcome = within(150, lambda: backend.run(ref, launch, on_line=lambda line: None), "the attempt to end")

    assert (outcome.reason, outcome.exit_code) == ("Error", 1), outcome.message
    assert time.monotonic() - started < 60, "the entrypoint must not wait on the job's FIFO or device"
    store = LocalEvidenceStore(tmp_path / "evidence")
    collected = within(60, lambda: backend.collect_evidence(ref, store, outcome), "the evidence to be collected")
    diagnosis = within(60, lambda: triage.classify(backend.signals(ref, outcome)), "triage")
    assert diagnosis.category == "code_error", diagnosis
    check_evidence(collected.manifest, store, tmp_path / "evidence", "runs/hostile-1/attempt-1")
    resumable = within(30, lambda: backend.checkpoints("hostile-1"), "the checkpoints to be listed")
    assert [Path(p).name for p in resumable] == ["step-000001.pt"]
