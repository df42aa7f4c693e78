"""The backend contract: what the attempt flow relies on, the same from the local backend, Kubernetes
(kubesim) and a real Slurm cluster, as the two evidence stores share tests/stores/test_store_contract.py.

Each case launches a tiny command through the `Backend` seam alone: one that saves two checkpoints
and succeeds, one that fails with an exit code, one that goes silent and is stopped by its
`stall_seconds`. The outcome, the evidence kept, what triage is handed, the checkpoints listed, a
live supervisor (for the backends that record one, `Supervises`) and adoption (for the backends
whose attempt outlives its flow process) are checked alike. kubesim's `nvidia.com/gpu` is the only
stand-in (no GPU exists here); the commands ask for none.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from trainguard.core import triage
from trainguard.core.backends.base import COMPLETED, AttemptOutcome, AttemptRef, Backend, Launch
from trainguard.core.backends.capabilities import ListsCheckpoints, ReadsCheckpoints, Supervises
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.backends.slurm.backend import SlurmBackend
from trainguard.core.backends.slurm.client import SlurmClient
from trainguard.core.backends.workspace import CRASH_REPORT, LOGS, log_name
from trainguard.core.checkpoints import facts
from trainguard.core.stores.folder import LocalEvidenceStore

SAVES_AND_SUCCEEDS = (
    "import os, pathlib\n"
    "folder = pathlib.Path(os.environ['TRAINGUARD_CHECKPOINT_DIR'])\n"
    "folder.mkdir(parents=True, exist_ok=True)\n"
    "for step in (2, 3):\n"
    "    (folder / f'step-{step:06d}.pt').write_bytes(b'weights %d' % step)\n"
    "print('contract: saved step 3', flush=True)\n"
)
FAILS = "import sys\nprint('contract: about to fail', flush=True)\nsys.exit(3)\n"
GOES_SILENT = "import time\nprint('contract: now silent', flush=True)\ntime.sleep(600)\n"


@dataclass
class Subject:
    """One backend under the contract, and how its commands name Python."""

    backend: Backend
    python: str
    lines: list[str] = field(default_factory=list)
    launched: Callable[[AttemptRef], int] | None = None  # jobs made for an attempt, where it can be adopted

    def launch(self, run_id: str, code: str, **fields: Any) -> Launch:
        return Launch(run_id=run_id, attempt=1, command=(self.python, "-c", code), **fields)

    def run(self, run_id: str, code: str, **fields: Any) -> tuple[AttemptRef, AttemptOutcome]:
        ref = self.backend.provision(run_id, 1)
        return ref, self.backend.run(ref, self.launch(run_id, code, **fields), on_line=self.lines.append)


def _local(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    return Subject(LocalBackend(tmp_path / "work", grace_seconds=2.0), sys.executable)


def _kubernetes(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    kube, ns, sim = (request.getfixturevalue(name) for name in ("kube", "ns", "sim"))
    backend = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                           local_root=str(tmp_path / "local")))

    def launched(ref: AttemptRef) -> int:
        return len([r for r in sim.requests(verb="create", resource="jobs", namespace=ns) if r["code"] == 201])

    return Subject(backend, "python", launched=launched)


def _slurm(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    cluster = request.getfixturevalue("slurm_node_up")
    client = SlurmClient(env={**os.environ, "SLURM_CONF": str(cluster.conf)})
    backend = SlurmBackend(tmp_path / "shared", client=client, poll_max_seconds=0.5)

    def launched(ref: AttemptRef) -> int:
        done = cluster.run("squeue", "--noheader", "--states=all", f"--name={ref.name}", "--format=%i", check=False)
        return len(done.stdout.split())

    return Subject(backend, sys.executable, launched=launched)


_MAKERS = {"local": _local, "kubernetes": _kubernetes, "slurm": _slurm}


@pytest.fixture(params=list(_MAKERS))
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    yield _MAKERS[request.param](request, tmp_path)


def _kept(subject: Subject, ref: AttemptRef, outcome: AttemptOutcome, store: LocalEvidenceStore) -> dict[str, Any]:
    """Evidence collected (and the attempt released) as the flow does: the kept items by name, and the crash report."""
    collected = subject.backend.collect_evidence(ref, store, outcome)
    subject.backend.release(ref)
    names = {item.name for item in collected.manifest.items}
    crash = next((json.loads(store.get_bytes(item.key)) for item in collected.manifest.items
                  if item.name.endswith(CRASH_REPORT) and "/" not in item.name), None)
    return {"names": names, "crash": crash, "manifest": collected.manifest}


def _log_item(names: set[str], run_id: str) -> str | None:
    """The attempt's training log among the kept items, under whatever folder the backend keeps it."""
    wanted = f"{LOGS}/{log_name(run_id, 1)}"
    return next((name for name in names if name == wanted or name.endswith("/" + wanted)), None)


def test_a_command_that_succeeds_is_completed_with_its_log_crash_report_and_checkpoints(subject: Subject,
                                                                                        tmp_path: Path) -> None:
    ref, outcome = subject.run("contract-ok", SAVES_AND_SUCCEEDS)

    assert (outcome.succeeded, outcome.exit_code, outcome.reason) == (True, 0, COMPLETED), outcome
    assert "contract: saved step 3" in subject.lines  # live output reached on_line
    kept = _kept(subject, ref, outcome, LocalEvidenceStore(tmp_path / "evidence"))
    assert _log_item(kept["names"], "contract-ok") is not None, sorted(kept["names"])
    assert kept["crash"] is not None and kept["crash"]["exit_code"] == 0
    signals = subject.backend.signals(ref, outcome)
    assert signals.exit_code == 0 and b"contract: saved step 3" in _text(signals.log)
    listed = subject.backend.checkpoints("contract-ok")
    assert [Path(path).name for path in listed] == ["step-000003.pt", "step-000002.pt"]
    # the verdict's facts read the same folder: here, or as the backend's listing read it where it lies
    assert isinstance(subject.backend, ReadsCheckpoints | ListsCheckpoints)
    found = facts(subject.backend, "contract-ok", 1, None, listed[0])
    assert (found.newest_kind, found.newest_step) == ("periodic", 3)  # the command's own save, no acknowledgement


def test_a_command_that_fails_keeps_its_exit_code_through_outcome_evidence_and_triage(subject: Subject,
                                                                                      tmp_path: Path) -> None:
    ref, outcome = subject.run("contract-fail", FAILS)

    assert (outcome.succeeded, outcome.exit_code) == (False, 3), outcome
    assert outcome.reason != COMPLETED
    kept = _kept(subject, ref, outcome, LocalEvidenceStore(tmp_path / "evidence"))
    assert kept["crash"] is not None and kept["crash"]["exit_code"] == 3
    signals = subject.backend.signals(ref, outcome)
    assert signals.exit_code == 3 and b"contract: about to fail" in _text(signals.log)
    assert subject.backend.checkpoints("contract-fail") == []


def test_a_silent_command_is_stopped_at_its_stall_bound_while_its_supervisor_is_seen_alive(subject: Subject,
                                                                                           tmp_path: Path) -> None:
    ended: list[AttemptOutcome] = []
    ref = subject.backend.provision("contract-stall", 1)
    follow = threading.Thread(target=lambda: ended.append(subject.backend.run(
        ref, subject.launch("contract-stall", GOES_SILENT, stall_seconds=3.0), on_line=subject.lines.append)))
    follow.start()
    try:
        wait_for(lambda: "contract: now silent" in subject.lines, timeout=120, what="the command to start")
        if isinstance(subject.backend, Supervises):  # the attempt is known to be followed, by this process
            assert subject.backend.supervisor_pid("contract-stall", 1) == os.getpid()
            assert subject.backend.attempts("contract-stall") == [1]
    finally:
        follow.join(180)
    assert ended, "the backend did not stop the silent command within 180s"
    outcome = ended[0]

    assert (outcome.succeeded, outcome.reason) == (False, "Stalled"), outcome
    kept = _kept(subject, ref, outcome, LocalEvidenceStore(tmp_path / "evidence"))
    assert _log_item(kept["names"], "contract-stall") is not None, sorted(kept["names"])
    diagnosis = triage.classify(subject.backend.signals(ref, outcome))
    assert diagnosis.retryable and diagnosis.category.value == "timeout", diagnosis  # a stall is a time bound


@pytest.mark.parametrize("subject", ["kubernetes", "slurm"], indirect=True)  # a local attempt ends with its flow
def test_running_an_ended_attempt_again_adopts_it_instead_of_launching_another(subject: Subject) -> None:
    ref, first = subject.run("contract-adopt", FAILS)
    assert subject.launched is not None and subject.launched(ref) == 1

    again = subject.backend.run(subject.backend.provision("contract-adopt", 1), subject.launch("contract-adopt", FAILS))

    assert (again.exit_code, again.succeeded) == (first.exit_code, False) == (3, False)
    assert subject.launched(ref) == 1  # the same job, followed again: no second launch


def _text(log: Any) -> bytes:
    """A log source's bytes, whichever form the backend gives it in (a path, a file, text or bytes)."""
    if isinstance(log, os.PathLike) or (isinstance(log, str) and os.path.isfile(log)):
        return Path(log).read_bytes()
    if hasattr(log, "read"):
        return bytes(log.read())
    return log.encode() if isinstance(log, str) else bytes(log or b"")
