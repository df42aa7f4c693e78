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
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import trainguard_entrypoint

from trainguard.core.backends import workspace_evidence
from trainguard.core.evidence.manifest import Manifest, ManifestItem, MissingItem, attempt_prefix, store_manifest
from trainguard.core.backends.slurm.client import SlurmClient, SlurmError, accounting_rows, accounting_settled
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.backends.workspace import AttemptWorkspace

SLURM = "slurm"
_MAX_JOBCOMP_BYTES = 64 * 1024 * 1024
_NO_CONTROLLER = "the Slurm controller did not answer when the attempt ended (see runner.json)"


def entrypoint_archive(shared_folder: Path) -> Path:
    """`{shared}/.trainguard/entrypoint-<hash>.pyz`, built once per entrypoint version."""
    package = Path(trainguard_entrypoint.__file__).resolve().parent
    sources = sorted(p for p in package.glob("*.py"))
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(shared_folder) / ".trainguard" / f"entrypoint-{digest.hexdigest()[:16]}.pyz"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sources:
            archive.writestr(f"trainguard_entrypoint/{path.name}", path.read_bytes())
        archive.writestr("__main__.py", "import sys\nfrom trainguard_entrypoint.__main__ import main\nsys.exit(main())\n")
    partial = target.with_name(f".{target.name}.{id(buffer)}.tmp")
    partial.write_bytes(buffer.getvalue())
    partial.replace(target)  # atomic: concurrent flows build the same bytes
    return target


class _Slurm:
    """Stores the Slurm items of one attempt and keeps their manifest entries."""

    def __init__(self, store: EvidenceStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix
        self.items: list[ManifestItem] = []
        self.missing: list[MissingItem] = []

    def put(self, name: str, data: bytes | Path) -> None:
        key = f"{self.prefix}/{name}"
        stored = self.store.put_file(key, data) if isinstance(data, Path) else self.store.put_bytes(key, data)
        stamp = datetime.now(UTC).isoformat()
        self.items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, SLURM, stamp))

    def absent(self, name: str, reason: str) -> None:
        self.missing.append(MissingItem(name, SLURM, reason))

    def items_named(self, prefix: str) -> bool:
        return any(item.name.startswith(prefix) for item in self.items)

    def guarded(self, name: str, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # evidence never masks the failure it documents
            self.absent(name, f"could not collect: {type(exc).__name__}: {exc}")


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


def _job_files(s: _Slurm, client: SlurmClient, ws: AttemptWorkspace, job_id: str, reach: Reach) -> None:
    kept = ws.root / "slurm" / "scontrol-show-job.txt"
    if kept.is_file():
        s.put("slurm/scontrol-show-job.txt", kept)
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
        script = ws.root / "slurm-batch.sh"
        if script.is_file():
            s.put("slurm/batch-script.sh", script)  # as submitted, when Slurm's copy is gone
        else:
            s.absent("slurm/batch-script.sh", f"Slurm no longer has it ({exc}) and no copy was written")
    for stream in ("out", "err"):
        path = ws.root / f"slurm-{job_id}.{stream}"
        if path.is_file():
            s.put(f"slurm/{path.name}", path)
        else:
            s.absent(f"slurm/{path.name}", f"no file at {path}: the job may never have started")


def _other_files(s: _Slurm, ws: AttemptWorkspace, node_failed: bool) -> None:
    for path in sorted(p for p in (ws.root / "slurm").glob("scontrol-show-node-*.txt")):
        s.put(f"slurm/{path.name}", path)
    if node_failed and not s.items_named("slurm/scontrol-show-node-"):
        s.absent("slurm/scontrol-show-node.txt", "the node's state could not be read when the job ended")
    for name in ("slurm-job.json", "slurm-signal.txt"):
        if (ws.root / name).is_file():
            s.put(f"slurm/{name}", ws.root / name)
    tasks = ws.root / "tasks"
    if tasks.is_dir():
        for path in sorted(p for p in tasks.rglob("*") if p.is_file() and not p.name.startswith(".")):
            name = f"tasks/{path.relative_to(tasks).as_posix()}"
            s.guarded(name, partial(s.put, name, path))


def collect(
    ws: AttemptWorkspace, client: SlurmClient, store: EvidenceStore, *, job_id: str | None, node_failed: bool,
    extra: Mapping[str, bytes] | None = None, reach: Reach | None = None,
) -> Manifest:
    """Freeze the attempt's files and Slurm's account of its job into `store`; never raises."""
    reach = reach or Reach()
    local = workspace_evidence.collect_local_evidence(ws, store, extra=extra)
    s = _Slurm(store, attempt_prefix(ws.run_id, ws.attempt))
    if job_id is None:
        s.absent("slurm/scontrol-show-job.txt", "no Slurm job was submitted for this attempt (see runner.json)")
    else:
        for name, step in (
            ("slurm/sacct.txt", lambda: _accounting(s, client, job_id, reach)),
            ("slurm/jobcomp.txt", lambda: _jobcomp(s, client, job_id, reach)),
            ("slurm/job", lambda: _job_files(s, client, ws, job_id, reach)),
            ("slurm/other", lambda: _other_files(s, ws, node_failed)),
        ):
            s.guarded(name, step)
    manifest = Manifest(local.run_id, local.attempt, local.created_at, (*local.items, *s.items),
                        (*local.missing, *s.missing))
    return store_manifest(store, manifest, SLURM)


