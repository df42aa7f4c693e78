"""What a Slurm attempt leaves as evidence, and the entrypoint archive its job runs.

`collect` freezes the attempt's workspace on the shared folder with the local collector (log, crash
report, snapshots, core dumps, checkpoint), then adds Slurm's own account of the job: the
accounting record of the job and every step (`sacct`, once final), `scontrol show job` as kept at the end, the batch script,
the job's stdout and stderr files, the job-completion record, each other task's files and, after a
node failure, `scontrol show node`. Every piece that is not there is listed as missing with the
reason; nothing here raises.

`entrypoint_archive` packs the stdlib-only entrypoint into a zipapp on the shared folder, so the
compute nodes need only a Python, not this checkout.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import trainguard_entrypoint
from trainguard_entrypoint.files import write_bytes_atomic
from trainguard_entrypoint.trainpath import PACKAGES

from trainguard_entrypoint import safefiles

from trainguard.core import masking
from trainguard.core.backends import jobfiles, workspace_evidence
from trainguard.core.backends.jobfiles import Budget, JobFile
from trainguard.core.evidence.manifest import Manifest, attempt_prefix, store_manifest
from trainguard.core.backends.slurm import continuation, job
from trainguard.core.backends.slurm.client import SlurmClient, SlurmError, accounting_rows, accounting_settled
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.backends.workspace import AttemptWorkspace

SLURM = "slurm"
_MAX_JOBCOMP_BYTES = 64 * 1024 * 1024
_NO_CONTROLLER = "the Slurm controller did not answer when the attempt ended (see runner.json)"


def entrypoint_archive(shared_folder: Path) -> Path:
    """`{shared}/.trainguard/entrypoint-<hash>.pyz`, built once per entrypoint version."""
    root = Path(trainguard_entrypoint.__file__).resolve().parent.parent
    # the entrypoint and the training-side helper it puts on the command's path
    sources = [(f"{package}/{p.name}", p) for package in PACKAGES for p in sorted((root / package).glob("*.py"))]
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(shared_folder) / ".trainguard" / f"entrypoint-{digest.hexdigest()[:16]}.pyz"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in sources:
            archive.writestr(name, path.read_bytes())
        archive.writestr("__main__.py", "import sys\nfrom trainguard_entrypoint.__main__ import main\nsys.exit(main())\n")
    partial = target.with_name(f".{target.name}.{id(buffer)}.tmp")
    partial.write_bytes(buffer.getvalue())
    partial.replace(target)  # atomic: concurrent flows build the same bytes
    return target


def keep(ws: AttemptWorkspace, name: str, text: str) -> None:
    """Keep what Slurm said (``slurm/<name>`` in the attempt's folder) for the evidence, replacing any link
    the job left in its place: the folder is the job's to write, and a write through its link would land
    wherever it points."""
    folder = ws.root / "slurm"
    if folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
        folder.unlink()
    folder.mkdir(exist_ok=True)
    write_bytes_atomic(folder / name, text.encode("utf-8"))


class _Slurm:
    """Puts the Slurm items of one attempt through the attempt's bundle writer (their source: "slurm")."""

    def __init__(self, c: workspace_evidence.BundleWriter, masker: masking.Masker) -> None:
        self.c, self.masker = c, masker

    def put(self, name: str, data: bytes) -> None:
        self.c.put_bytes(name, data, SLURM)

    def put_job_file(self, name: str, path: Path, root: Path, kind: str = "report") -> None:
        """A file in the attempt's folder, which the job can write: masked, within budget, never followed."""
        job_file = jobfiles.log_file(path, root, self.c, self.masker) if kind == "log" else JobFile(
            path, root, kind, jobfiles.SMALL_FILE_LIMIT_BYTES, self.masker)
        jobfiles.put(self.c, "", name, SLURM, job_file)

    def absent(self, name: str, reason: str) -> None:
        self.c.absent(name, SLURM, reason)

    def items_named(self, prefix: str) -> bool:
        return any(item.name.startswith(prefix) for item in self.c.items)

    def guarded(self, name: str, step: Callable[[], None]) -> None:
        self.c.guarded(name, SLURM, step)  # evidence never masks the failure it documents


@dataclass(frozen=True)
class Reach:
    """What Slurm can be asked while collecting, and how long the accounting record may take to settle.

    Attributes:
        controller: slurmctld answers; False after the supervisor gave up on it, so no scontrol
            call waits out its connection timeout again (sacct asks slurmdbd, not the controller).
        settle_seconds: How long to wait for the job's accounting record to reach a terminal state
            (slurmctld sends it to slurmdbd just after the job ends). 0: take it as it is.
        clock, sleep: Injected for that wait.
    """

    controller: bool = True
    settle_seconds: float = 10.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def _accounting(s: _Slurm, client: SlurmClient, job_id: str, reach: Reach) -> None:
    """sacct's record of the job and every step, once final: `sacct.txt` (readable columns) and `sacct.json`."""
    deadline = reach.clock() + reach.settle_seconds
    while True:
        try:
            text = client.accounting(job_id)
        except SlurmError as exc:
            s.absent("slurm/sacct.txt", f"sacct has no record: {exc}")
            s.absent("slurm/sacct.json", "sacct has no record (see slurm/sacct.txt)")
            return
        settled = accounting_settled(accounting_rows(text), job_id)
        if settled or reach.clock() >= deadline:
            break
        reach.sleep(0.2)
    s.put("slurm/sacct.txt", text.encode("utf-8"))
    if not settled:
        s.absent("slurm/sacct-final", f"the accounting record was not final after {reach.settle_seconds:g}s; "
                 "sacct.txt holds it as it was")
    try:
        s.put("slurm/sacct.json", client.accounting_json(job_id).encode("utf-8"))
    except SlurmError as exc:
        s.absent("slurm/sacct.json", f"sacct --json failed (the columns are in slurm/sacct.txt): {exc}")


def _jobcomp(s: _Slurm, client: SlurmClient, job_id: str, reach: Reach) -> None:
    """The job-completion plugin's line for the job (jobcomp/filetxt), where the site writes one."""
    name = "slurm/jobcomp.txt"
    if not reach.controller:
        s.absent(name, _NO_CONTROLLER)
        return
    try:
        config = client.config()
    except SlurmError as exc:
        s.absent(name, f"scontrol show config failed: {exc}")
        return
    if config.get("JobCompType") != "jobcomp/filetxt":
        s.absent(name, f"the cluster's JobCompType is {config.get('JobCompType')!r}, not jobcomp/filetxt")
        return
    path = Path(config.get("JobCompLoc", ""))
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - _MAX_JOBCOMP_BYTES))
            lines = [line for line in handle.read().splitlines() if line.startswith(f"JobId={job_id} ".encode())]
    except OSError as exc:
        s.absent(name, f"cannot read JobCompLoc {str(path)!r} from here: {exc.strerror or exc}")
        return
    if lines:
        s.put(name, b"\n".join(lines) + b"\n")
    else:
        s.absent(name, f"no line for job {job_id} in {path} (the job may still be completing)")


def _job_files(s: _Slurm, client: SlurmClient, ws: AttemptWorkspace, jw: AttemptWorkspace, job_id: str,
               reach: Reach) -> None:
    kept = ws.root / "slurm" / "scontrol-show-job.txt"
    if os.path.lexists(kept):
        s.put_job_file("slurm/scontrol-show-job.txt", kept, ws.root)
    elif not reach.controller:
        s.absent("slurm/scontrol-show-job.txt", _NO_CONTROLLER)
    else:
        try:
            s.put("slurm/scontrol-show-job.txt", client.show_job_text(job_id).encode("utf-8"))
        except SlurmError as exc:
            s.absent("slurm/scontrol-show-job.txt", f"not kept at the end and gone now: {exc}")
    try:
        if not reach.controller:
            raise SlurmError(_NO_CONTROLLER)
        s.put("slurm/batch-script.sh", client.batch_script(job_id).encode("utf-8"))
    except SlurmError as exc:
        script = jw.root / "slurm-batch.sh"
        if os.path.lexists(script):
            s.put_job_file("slurm/batch-script.sh", script, jw.root)  # as submitted, when Slurm's copy is gone
        else:
            s.absent("slurm/batch-script.sh", f"Slurm no longer has it ({exc}) and no copy was written")
    for stream in ("out", "err"):
        path = jw.root / f"slurm-{job_id}.{stream}"
        if os.path.lexists(path):
            s.put_job_file(f"slurm/{path.name}", path, jw.root, kind="log")
        else:
            s.absent(f"slurm/{path.name}", f"no file at {jobfiles.shown(path)}: the job may never have started")


def _other_files(s: _Slurm, ws: AttemptWorkspace, jw: AttemptWorkspace, node_failed: bool) -> None:
    for entry in safefiles.walk(ws.root / "slurm", ws.root, max_depth=0):
        if entry.name.startswith("scontrol-show-node-") and entry.name.endswith(".txt"):
            s.guarded(f"slurm/{entry.name}", partial(s.put_job_file, f"slurm/{entry.name}", Path(entry.path), ws.root))
    if node_failed and not s.items_named("slurm/scontrol-show-node-"):
        s.absent("slurm/scontrol-show-node.txt", "the node's state could not be read when the job ended")
    for root, name in ((ws.root, continuation.JOB_RECORD), (jw.root, job.SIGNAL_MARKER)):
        if os.path.lexists(root / name):
            s.guarded(f"slurm/{name}", partial(s.put_job_file, f"slurm/{name}", root / name, root))
    tasks = jw.root / "tasks"
    if os.path.lexists(tasks):
        workspace_evidence.put_folder(s.c, "tasks", tasks, jw.root, SLURM, _task_file(s, tasks, jw.root),
                                      workspace_evidence.not_evidence)


def _task_file(s: _Slurm, tasks: Path, root: Path) -> Callable[[Path], JobFile]:
    """How a file of another task's folder (``tasks/<rank>/...``, the entrypoint's files of that rank) is copied."""
    cores = s.c.spent.budget.core_dump_bytes

    def job_file(path: Path) -> JobFile:
        part = path.relative_to(tasks).parts[1:2]
        if part == ("coredumps",):
            return JobFile(path, root, "core dump", cores)  # byte for byte, holes kept
        if part in (("logs",), ("ranks",)):
            return jobfiles.log_file(path, root, s.c, s.masker)
        return JobFile(path, root, "report", jobfiles.SMALL_FILE_LIMIT_BYTES, s.masker)

    return job_file


def collect(
    ws: AttemptWorkspace, client: SlurmClient, store: EvidenceStore, *, job_id: str | None, node_failed: bool,
    extra: Mapping[str, bytes] | None = None, reach: Reach | None = None, budget: Budget | None = None,
    masker: masking.Masker | None = None,
) -> Manifest:
    """Freeze the attempt's files and Slurm's account of its job into `store`; never raises.

    The job's files are read where the job writes them (`continuation.job_workspace`), every one of
    them masked but core dumps and checkpoints, each task's as the first task's.
    """
    reach, masker = reach or Reach(), masker or masking.current()
    c = workspace_evidence.BundleWriter(store, attempt_prefix(ws.run_id, ws.attempt), lambda: datetime.now(UTC),
                                        budget)
    jw = continuation.job_workspace(ws)
    workspace_evidence.collect_workspace(c, ws, masker=masker, files=jw)
    s = _Slurm(c, masker)
    if job_id is None:
        s.absent("slurm/scontrol-show-job.txt", "no Slurm job was submitted for this attempt (see runner.json)")
    else:
        for name, step in (
            ("slurm/sacct.txt", lambda: _accounting(s, client, job_id, reach)),
            ("slurm/jobcomp.txt", lambda: _jobcomp(s, client, job_id, reach)),
            ("slurm/job", lambda: _job_files(s, client, ws, jw, job_id, reach)),
            ("slurm/other", lambda: _other_files(s, ws, jw, node_failed)),
        ):
            s.guarded(name, step)
    c.guarded("extra", workspace_evidence.WORKSPACE, lambda: workspace_evidence.put_extra(c, extra))
    manifest = Manifest(ws.run_id, ws.attempt, datetime.now(UTC).isoformat(), tuple(c.items), tuple(c.missing))
    return store_manifest(store, manifest, SLURM)
