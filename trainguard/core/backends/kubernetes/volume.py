"""The entrypoint's files on the attempt's volume, as evidence items named as the local collector names them.

The collector pod (``collector``) brings the attempt's folder back as a tar; this module turns its
members into items (``logs/train-…log``, ``crash-report.json``, ``snapshot/…``, ``coredumps/…``),
lists the checkpoints, and records as missing, with the reason, everything the local collector
would expect and the volume did not hold: so `trainguard evidence show` reads a Kubernetes attempt
as it reads a local one. Files are streamed from the tar to spool files; nothing is held whole in
memory. Names are the collector's printable spellings (the job's own spelling is kept in the
manifest as the original name), every file but a core dump is masked, and a file the collector
could send only in part is stored up to where it was whole and listed as cut.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

from trainguard_entrypoint import safefiles
from trainguard_entrypoint.files import read_json_object, read_tail_lines

from trainguard.core.backends import workspace
from trainguard.core.backends.workspace_evidence import CRASH_TAIL_LINES, ENTRYPOINT
from trainguard.core.backends.workspace import EXPECTED_SNAPSHOTS
from trainguard.core.backends.kubernetes import collector, kinds
from trainguard.core.backends.kubernetes.scene import ClusterWriter, Scene, facts_of
from trainguard.core.stores.base import EvidenceStoreError, validate_key

VOLUME = "kubernetes-volume"
# the entrypoint's files, torchrun's rank logs and error file, the ranks' stacks, and other nodes' folders
_KNOWN = (*(f"{name}/" for name in (workspace.LOGS, workspace.SNAPSHOT, workspace.COREDUMPS)), workspace.CRASH_REPORT,
          *(f"{name}/" for name in (workspace.RANKS, workspace.TORCHELASTIC, workspace.STACKS, workspace.NODE_FOLDERS)))
# what triage reads of each node's folder (the first node's is the attempt's own, node N's `tasks/N`)
_E = re.escape
_NODE_FILE = re.compile(
    rf"({_E(workspace.NODE_FOLDERS)}/\d+/)?({_E(workspace.LOGS)}/train-[^/]+\.log|{_E(workspace.CRASH_REPORT)}|"
    rf"{_E(workspace.TORCHELASTIC)}/{_E(workspace.TORCHELASTIC_ERROR)}|"
    rf"{_E(workspace.RANKS)}/[^/]+/attempt_\d+/\d+/{_E(workspace.TORCHELASTIC_ERROR)}|"
    rf"{_E(workspace.SNAPSHOT)}/{_E(workspace.ENV_SNAPSHOT)}|{_E(workspace.STACKS)}/[^/]+)"
)


def _template_spec(s: Scene) -> dict[str, Any] | None:
    template = kinds.pod_template(s.job or {})
    if isinstance(template, dict):
        return template
    pod = s.main_pod()
    return (pod or {}).get("spec") or None


def _item_name(member: str) -> str | None:
    """The manifest name of a file from the volume; None for a name that is not a safe key."""
    name = posixpath.normpath(member)
    if name.startswith(("/", "../")) or name in (".", ".."):
        return None
    if not any(name == known or name.startswith(known) for known in _KNOWN):
        name = f"volume/{name}"  # never over kubernetes/… or manifest.json
    try:
        return validate_key(name)
    except EvidenceStoreError:
        return None


def _log_item(s: Scene) -> str:
    """The entrypoint's log, by the name the entrypoint gives it: the one log triage reads.

    Other files a job leaves under ``logs/`` (metrics, a framework's own log) are kept as evidence
    but never decide the verdict, whatever order the volume lists them in.
    """
    return f"{workspace.LOGS}/{workspace.log_name(s.run_id, s.attempt)}"


def _original(name: str) -> str:
    """The name as the job spelled it, where the collector spelled it printably (else "")."""
    original = "/".join(safefiles.original_name(segment) for segment in name.split("/"))
    return "" if original == name else original


def _unpack(c: ClusterWriter, s: Scene, tar_path: Path, cut: dict[str, dict[str, Any]]) -> set[str]:
    """Store each member; one the collector could send only in part (``cut``) is stored up to where it
    was whole, and said to be cut."""
    found: set[str] = set()
    log_item = _log_item(s)
    with tarfile.open(tar_path, "r:gz") as tar:
        for index, member in enumerate(tar):
            name = _item_name(member.name)
            shown = safefiles.safe_name(member.name)
            if not member.isfile() or name is None:
                c.absent(f"volume/{shown}", VOLUME, f"{shown} skipped: not a regular file with a name fit for a key")
                continue
            spool = s.spool / f"volume-{index}"
            source = tar.extractfile(member)
            if source is None:
                continue
            with source, spool.open("wb") as out:
                shutil.copyfileobj(source, out, 1024 * 1024)
                if member.name in cut:  # the rest is zeros standing in for what could not be read
                    out.truncate(int(cut[member.name].get("valid_bytes") or 0))
                    c.absent(f"{name} (cut)", ENTRYPOINT, f"stored up to byte {cut[member.name].get('valid_bytes')} "
                             f"of {member.size}: {cut[member.name].get('reason')}", _original(name))
            if not name.startswith(f"{workspace.COREDUMPS}/"):  # a core dump masked would be corrupt
                spool = c.mask_file(spool, spool.with_suffix(".masked"))
            c.put_file(name, spool, ENTRYPOINT, _original(name))
            found.add(name)
            if name == log_item:
                s.volume_log = (name, spool)
            if _NODE_FILE.fullmatch(name):
                s.node_files[name] = spool
            if name == workspace.CRASH_REPORT:
                s.crash_report = spool
    return found


def _no_crash_report(s: Scene) -> str:
    facts = facts_of(s)
    ended = f"{facts.reason or 'unknown reason'}, exit code {facts.exit_code}"
    if facts.exit_code == 137 or facts.reason == "OOMKilled":
        return f"the entrypoint was killed (SIGKILL) before writing its crash report ({ended})"
    if facts.exit_code is None:
        return f"the training container never ended here ({ended}): no crash report was written"
    return f"the entrypoint wrote no crash report ({ended})"


def _expected(c: ClusterWriter, s: Scene, found: set[str], meta: dict[str, Any], tar: bool) -> None:
    log_name = _log_item(s)
    why = "the volume was not read" if not tar else "not on the volume"
    if log_name not in found:
        c.absent(log_name, ENTRYPOINT, f"{why}: {meta.get('workspace_absent') or 'the entrypoint wrote no log'}")
    if workspace.CRASH_REPORT not in found:
        c.absent(workspace.CRASH_REPORT, ENTRYPOINT, f"{why}: {_no_crash_report(s)}")
    for expected in EXPECTED_SNAPSHOTS:
        if expected not in found:
            c.absent(expected, ENTRYPOINT, f"{why}: the entrypoint did not write it")
    if not any(n.startswith(f"{workspace.COREDUMPS}/") for n in found):
        crash = read_json_object(s.crash_report) if s.crash_report else None
        reason = (crash or {}).get("core_absent_reason") or "no core file was kept"
        c.absent(workspace.COREDUMPS, ENTRYPOINT, f"{why}: {reason}")


def _checkpoints(c: ClusterWriter, meta: dict[str, Any]) -> None:
    listing = meta.get("checkpoints")
    if not isinstance(listing, dict):
        c.absent("checkpoints.json", VOLUME, "the checkpoint folder was not listed (no checkpoint volume named)")
        c.absent("checkpoint", VOLUME, "no checkpoint folder to look in")
        return
    c.put_json("checkpoints.json", listing, VOLUME)
    files = [f for f in listing.get("files") or () if isinstance(f, dict)]
    if not files:
        c.absent("checkpoint", VOLUME, f"no checkpoint in {listing.get('dir')}: {listing.get('absent') or 'empty'}")
        return
    newest = max(files, key=lambda f: str(f.get("mtime")))
    c.absent(f"checkpoint/{newest.get('name')}", VOLUME,
             f"not copied through the cluster: it stays on the checkpoint volume at {listing.get('dir')}")


def _crash_tail(c: ClusterWriter, s: Scene) -> None:
    source = s.volume_log[1] if s.volume_log else None
    if source is None:
        facts = facts_of(s)
        source = Path(facts.log_path) if facts.log_path else None
    if source is None:
        c.absent("crash-tail.txt", VOLUME, "no log to take the tail of")
        return
    lines = [c.masker.for_people(line) for line in read_tail_lines(source, CRASH_TAIL_LINES, max_bytes=1024 * 1024)]
    c.put_bytes("crash-tail.txt", ("\n".join(lines) + "\n" if lines else "").encode("utf-8"), VOLUME)


def store_volume_files(c: ClusterWriter, s: Scene, *, budget_bytes: int, start_timeout_seconds: float) -> None:
    """Read the attempt's folder through a collector pod and store its files; record what is missing."""
    found: set[str] = set()
    meta: dict[str, Any] = {}
    tar = False
    template = _template_spec(s)
    if template is None:
        reason = "neither the Job nor any pod of it is left to say which volume held the attempt's files"
        c.absent("volume", VOLUME, reason)
    else:
        plan = collector.plan(template)
        node = s.node()
        if plan.absent:
            c.absent("volume", VOLUME, plan.absent)
        elif plan.needs_node and not node:
            c.absent("volume", VOLUME, "the files are on a hostPath volume and neither a pod nor an event says "
                                      "which node held it")
        else:
            # Job-shaped for the collector pod, whatever the kind: its name, labels and pod template
            meta = (s.job or {}).get("metadata") or {"name": s.job_name}
            job = {"metadata": meta, "spec": {"template": {"spec": template}}}
            fetched = collector.fetch(c.api, s.namespace, job, plan, s.spool / "volume.tar.gz", node=node,
                                      budget_bytes=budget_bytes, start_timeout_seconds=start_timeout_seconds)
            for problem in fetched.problems:
                c.absent("volume", VOLUME, problem)
            meta = fetched.meta
            if fetched.tar_path is not None:
                tar = True
                problems = [p for p in meta.get("problems", ()) if isinstance(p, dict)]
                found = _unpack(c, s, fetched.tar_path, {str(p.get("name")): p for p in problems if p.get("sent")})
                for skipped in [*meta.get("skipped", ()), *(p for p in problems if not p.get("sent"))]:
                    name = _item_name(str(skipped.get("name"))) or "volume"
                    c.absent(name, ENTRYPOINT, str(skipped.get("reason")), _original(name))
    _expected(c, s, found, meta, tar)
    if tar:
        _checkpoints(c, meta)
    c.guarded("crash-tail.txt", VOLUME, lambda: _crash_tail(c, s))

