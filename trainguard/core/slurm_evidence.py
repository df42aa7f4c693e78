"""What a Slurm attempt leaves as evidence, and the entrypoint archive its job runs.

`collect` freezes the attempt's workspace on the shared folder with the local collector (log, crash
report, snapshots, core dumps, checkpoint), then adds Slurm's own account of the job: the
accounting record of every step (`sacct`), `scontrol show job` as kept at the end, the batch script,
the job's stdout and stderr files, the job-completion record, each other task's files and, after a
node failure, `scontrol show node`. Every piece that is not there is listed as missing with the
reason; nothing here raises.

`entrypoint_archive` packs the stdlib-only entrypoint into a zipapp on the shared folder, so the
compute nodes need only a Python, not this checkout.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import trainguard_entrypoint

from trainguard.core import evidence
from trainguard.core.manifest import Manifest, ManifestItem, MissingItem, attempt_prefix, store_manifest
from trainguard.core.slurm import SlurmClient, SlurmError
from trainguard.core.stores import EvidenceStore
from trainguard.core.workspace import AttemptWorkspace

SLURM = "slurm"
_MAX_JOBCOMP_BYTES = 64 * 1024 * 1024


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


def _accounting(s: _Slurm, client: SlurmClient, job_id: str) -> None:
    try:
        form, text = client.accounting(job_id)
    except SlurmError as exc:
        s.absent("slurm/sacct.json", f"sacct has no record: {exc}")
        return
    s.put("slurm/sacct.json" if form == "json" else "slurm/sacct.txt", text.encode("utf-8"))


def _jobcomp(s: _Slurm, client: SlurmClient, job_id: str) -> None:
    """The job-completion plugin's line for the job (jobcomp/filetxt), where the site writes one."""
    name = "slurm/jobcomp.txt"
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


def _job_files(s: _Slurm, client: SlurmClient, ws: AttemptWorkspace, job_id: str) -> None:
    kept = ws.root / "slurm" / "scontrol-show-job.txt"
    if kept.is_file():
        s.put("slurm/scontrol-show-job.txt", kept)
    else:
        try:
            s.put("slurm/scontrol-show-job.txt", client.show_job_text(job_id).encode("utf-8"))
        except SlurmError as exc:
            s.absent("slurm/scontrol-show-job.txt", f"not kept at the end and gone now: {exc}")
    try:
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
    extra: Mapping[str, bytes] | None = None,
) -> Manifest:
    """Freeze the attempt's files and Slurm's account of its job into `store`; never raises."""
    local = evidence.collect_local_evidence(ws, store, extra=extra)
    s = _Slurm(store, attempt_prefix(ws.run_id, ws.attempt))
    if job_id is None:
        s.absent("slurm/scontrol-show-job.txt", "no Slurm job was submitted for this attempt (see runner.json)")
    else:
        for name, step in (
            ("slurm/sacct.json", lambda: _accounting(s, client, job_id)),
            ("slurm/jobcomp.txt", lambda: _jobcomp(s, client, job_id)),
            ("slurm/job", lambda: _job_files(s, client, ws, job_id)),
            ("slurm/other", lambda: _other_files(s, ws, node_failed)),
        ):
            s.guarded(name, step)
    manifest = Manifest(local.run_id, local.attempt, local.created_at, (*local.items, *s.items),
                        (*local.missing, *s.missing))
    return store_manifest(store, manifest, SLURM)


