"""What a Kubernetes attempt keeps on the flow's machine for triage, against kubesim: private, masked, trusted.

Collection keeps each attempt's triage facts, log and nodes' files in a folder on this machine and
triage reads them back. Another local user who could write that folder would choose the verdict
(a `triage.json` naming a log of their own); what is kept can hold a job's secrets. The folder is
this user's alone (0700), one open to others is refused (the facts are then not kept there and
the attempt is judged on what its supervisor saw), and `attempt.json` is masked as the store's copy.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from hostile import SHAPED, within
from test_multinode import two_nodes

from trainguard.core import judging
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes import localdir
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core.stores.folder import LocalEvidenceStore

CODE_ERROR = ("import sys\nprint('Traceback (most recent call last):', flush=True)\n"
              "print(\"TypeError: unsupported operand type(s) for +: 'int' and 'str'\", flush=True)\nsys.exit(1)\n")
GPU_FAULT = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"


def _plant(folder: Path, tmp_path: Path) -> None:
    """What another user writes into a folder open to them: facts naming a log of theirs."""
    theirs = tmp_path / "theirs.log"
    theirs.write_text(GPU_FAULT)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "triage.json").write_text(json.dumps({"reason": "Error", "exit_code": 1, "log_path": str(theirs)}))


def test_a_folder_open_to_others_is_refused_and_facts_planted_there_do_not_judge(
        kube: KubeApi, ns: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                     local_root=str(shared)))
    ref = b.provision("k-open", 1)
    outcome = within(120, lambda: b.run(ref, Launch("k-open", 1, (sys.executable, "-c", CODE_ERROR))), "the attempt")
    manifest = b.collect_evidence(ref, LocalEvidenceStore(tmp_path / "evidence"), outcome).manifest
    _plant(shared / "runs" / "k-open" / "attempt-1", tmp_path)  # between collection and judging

    judged = judging.judge(b, ref, outcome)

    assert judged.diagnosis is not None and judged.diagnosis.category == "code_error", judged.diagnosis
    reasons = {item.name: item.reason for item in manifest.missing}
    assert "is open to others (mode 777)" in reasons["triage.json (kept on this machine)"], reasons


def test_the_default_folder_is_this_users_0700_and_one_made_first_by_another_user_is_refused(
        kube: KubeApi, ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # asked again, from TMPDIR
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns)))
    folder = b.kept_dir("k-default", 1)
    root = tmp_path / f"trainguard-kube-{os.getuid()}"
    assert folder == root / "runs" / "k-default" / "attempt-1"
    for made in (root, root / "runs", root / "runs" / "k-default", folder):
        assert stat.S_IMODE(made.lstat().st_mode) == 0o700, made

    os.chown(root, 65534, 65534)  # another local user's, made before ours (the tests run as root)
    with pytest.raises(localdir.UnsafeFolder, match="belongs to uid 65534, not to this user"):
        b.kept_dir("k-default", 1)
    os.chown(root, os.getuid(), os.getgid())
    os.chmod(root, 0o755)
    with pytest.raises(localdir.UnsafeFolder, match="is open to others"):
        b.kept_dir("k-default", 1)
    root.rmdir() if not any(root.iterdir()) else None


def test_a_link_in_the_kept_folder_is_not_written_through(tmp_path: Path) -> None:
    root = tmp_path / "root"
    localdir.make_dirs(root / "runs" / "r" / "attempt-1", localdir.private_root(str(root)))
    victim = tmp_path / "victim"
    victim.write_text("unchanged")
    (root / "runs" / "r" / "attempt-1" / "triage.json").symlink_to(victim)
    (root / "runs" / "r" / "attempt-2").symlink_to(tmp_path)

    with pytest.raises(OSError):
        localdir.write_private(root / "runs" / "r" / "attempt-1" / "triage.json", b"{}")
    with pytest.raises(localdir.UnsafeFolder, match="not a folder but a link"):
        localdir.make_dirs(root / "runs" / "r" / "attempt-2", root)
    assert victim.read_text() == "unchanged"


def test_a_multi_node_attempts_kept_map_is_masked_and_private(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    """Node 1's entrypoint is killed first: its pod's termination message is its log's tail, token and all."""
    b = two_nodes(kube, ns, tmp_path, survivor_grace_seconds=2.0)
    ref = b.provision("mn-masked", 1)
    code = ("import os, signal, sys, time\n"
            f"print('logging in with {SHAPED}', flush=True)\n"
            "if os.environ['NODE_RANK'] == '1':\n"
            "    time.sleep(1); os.kill(os.getppid(), signal.SIGKILL); time.sleep(5)\n"
            "sys.exit(2)\n")
    outcome = within(180, lambda: b.run(ref, Launch(run_id="mn-masked", attempt=1, command=(sys.executable, "-c", code),
                                                     nodes=2, gpus=1)), "the attempt")
    b.collect_evidence(ref, LocalEvidenceStore(tmp_path / "evidence"), outcome)

    kept = b.kept_dir("mn-masked", 1) / "attempt.json"
    text = kept.read_text()
    assert "logging in with" in text, "the termination message is kept"
    assert SHAPED not in text
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
