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

import pytest
from hostile import HOSTILE_TRAINER, SECRET, check_evidence, host_file, within

from trainguard.core import triage
from trainguard.core.backends.base import Launch
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
from trainguard.core.stores.s3.spool import Spool
from trainguard.core.stores.s3.store import S3Store
from s3fixtures import FAST, s3, s3_server  # noqa: F401  (fixtures)


@pytest.fixture
def s3_store(s3, tmp_path: Path):
    """A factory of an S3 store on a fresh moto bucket (``.objects()``: the bucket's keys as S3 lists them)."""
    bucket = s3.new_bucket()

    def make() -> S3Store:
        settings = S3Settings(bucket=bucket, region="us-east-1", endpoint_url=s3.proxy.url)
        return S3Store(S3Bucket(settings), "tg", Spool(tmp_path / "spool", FAST.part_bytes), FAST)

    make.objects = lambda: sorted(s3.objects(bucket))  # type: ignore[attr-defined]
    return make


@pytest.mark.parametrize("kind", ["folder", "s3"])
def test_a_job_that_plants_links_fifos_devices_sparse_files_and_escapes_ends_as_its_code_error_promptly(
        kind: str, s3_store, tmp_path: Path) -> None:
    secret = host_file(tmp_path / "host")
    backend = LocalBackend(tmp_path / "work", grace_seconds=2.0)
    ref = backend.provision("hostile-1", 1)
    launch = Launch("hostile-1", 1, (sys.executable, "-c", HOSTILE_TRAINER, str(secret)), env={"HF_TOKEN": SECRET},
                    deadline_seconds=120)
    started = time.monotonic()

    outcome = within(150, lambda: backend.run(ref, launch, on_line=lambda line: None), "the attempt to end")

    assert (outcome.reason, outcome.exit_code) == ("Error", 1), outcome.message
    assert time.monotonic() - started < 60, "the entrypoint must not wait on the job's FIFO or device"
    store = LocalEvidenceStore(tmp_path / "evidence") if kind == "folder" else s3_store()
    collected = within(60, lambda: backend.collect_evidence(ref, store, outcome), "the evidence to be collected")
    diagnosis = within(60, lambda: triage.classify(backend.signals(ref, outcome)), "triage")
    assert diagnosis.category == "code_error", diagnosis
    check_evidence(collected.manifest, store, tmp_path / "evidence" if kind == "folder" else None,
                   "runs/hostile-1/attempt-1")
    if kind == "s3":  # the bucket's own keys: what `aws s3 ls` prints
        keys = s3_store.objects()
        assert keys and all(key.isprintable() for key in keys), [key for key in keys if not key.isprintable()]
        assert "tg/runs/hostile-1/attempt-1/coredumps/%1B[31mred%E2%80%AEexe.core" in keys
    resumable = within(30, lambda: backend.checkpoints("hostile-1"), "the checkpoints to be listed")
    assert [Path(p).name for p in resumable] == ["step-000001.pt"]
