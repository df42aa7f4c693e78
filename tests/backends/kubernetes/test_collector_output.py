"""The collector's program and its reader, without a cluster: the program runs here as it runs in the pod.

What goes through the pod's log must come back byte for byte, or be refused: a log cut short or
rotated away must never pass for the whole attempt folder.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from trainguard.core.backends.kubernetes import collector, collector_program


def _run(workspace: Path, checkpoints: Path, budget: int = 1 << 20, timeout_seconds: float = 600) -> bytes:
    """The program as the pod runs it: each folder checked from its volume's mount point (here, its parent)."""
    argv = [str(workspace), str(workspace.parent), str(checkpoints), str(checkpoints.parent), str(budget),
            str(timeout_seconds)]
    done = subprocess.run([sys.executable, "-c", collector_program.script(), *argv], capture_output=True, timeout=60,
                          check=True)
    return done.stdout


@pytest.fixture
def attempt(tmp_path: Path) -> tuple[Path, Path]:
    ws, ckpt = tmp_path / "attempt", tmp_path / "ckpt"
    (ws / "logs").mkdir(parents=True)
    (ws / "coredumps").mkdir()
    ckpt.mkdir()
    (ws / "logs" / "train-r-attempt-1.log").write_bytes(b"step 1\n\xff\xfe not utf-8\n" * 1000)
    (ws / "crash-report.json").write_text('{"exit_code": 139}')
    (ws / "coredumps" / "core.123").write_bytes(bytes(range(256)) * 4000)
    (ckpt / "step-000002.pt").write_bytes(b"w" * 10)
    return ws, ckpt


def _members(tar_bytes: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_the_attempt_folder_comes_back_byte_for_byte_with_the_checkpoint_listing(
    attempt: tuple[Path, Path],
) -> None:
    ws, ckpt = attempt
    spool = io.BytesIO()
    meta = collector.decode(iter([_run(ws, ckpt)]), spool)
    members = _members(spool.getvalue())
    assert list(members) == ["crash-report.json", "logs/train-r-attempt-1.log", "coredumps/core.123"]
    for name, data in members.items():
        assert data == (ws / name).read_bytes()
    assert [f["name"] for f in meta["checkpoints"]["files"]] == ["step-000002.pt"]


def test_files_over_the_budget_stay_on_the_volume_and_say_so(attempt: tuple[Path, Path]) -> None:
    ws, ckpt = attempt
    spool = io.BytesIO()
    meta = collector.decode(iter([_run(ws, ckpt, budget=100_000)]), spool)
    assert "coredumps/core.123" not in _members(spool.getvalue())
    skipped = {s["name"]: s["reason"] for s in meta["skipped"]}
    assert "over the 100000-byte copy budget" in skipped["coredumps/core.123"]


@pytest.mark.parametrize("damage", ["cut", "rotated"])
def test_a_cut_or_rotated_output_is_refused(attempt: tuple[Path, Path], damage: str) -> None:
    lines = _run(*attempt).splitlines(keepends=True)
    if damage == "cut":
        kept = lines[: len(lines) // 2]
        expected = "without its END marker"
    else:  # the first lines of the tar went with a rotated log file
        first = next(i for i, line in enumerate(lines) if not line.startswith(collector_program.MAGIC.encode()))
        kept = lines[:first] + lines[first + 2:]
        expected = "cut or rotated"
    with pytest.raises(ValueError, match=expected):
        collector.decode(iter([b"".join(kept)]), io.BytesIO())


def test_a_missing_workspace_is_reported_not_failed(tmp_path: Path) -> None:
    meta = collector.decode(iter([_run(tmp_path / "nowhere", tmp_path / "nothing")]), io.BytesIO())
    assert "no such directory" in meta["workspace_absent"]
    assert meta["checkpoints"]["absent"].startswith("no such directory")


def _spec(volume: dict[str, object]) -> dict[str, object]:
    return {"containers": [{"name": "train", "image": "img",
                            "env": [{"name": "TRAINGUARD_RUN_ID", "value": "r"},
                                    {"name": "TRAINGUARD_WORKSPACE", "value": "/tg/attempt"}],
                            "volumeMounts": [{"name": "a", "mountPath": "/tg"}]}],
            "volumes": [{"name": "a", **volume}]}


def test_plan_mounts_the_same_volume_read_only_and_pins_a_host_path_to_its_node() -> None:
    pvc = collector.plan(_spec({"persistentVolumeClaim": {"claimName": "c"}}))
    assert pvc.absent is None and not pvc.needs_node and pvc.mounts[0]["readOnly"] is True
    host = collector.plan(_spec({"hostPath": {"path": "/data"}}))
    assert host.needs_node
    body = collector.pod_manifest({"metadata": {"name": "j"}, "spec": {"template": {"spec": {}}}}, host,
                                  node="gpu-7", budget_bytes=10)
    assert body["spec"]["nodeName"] == "gpu-7" and body["spec"]["restartPolicy"] == "Never"


def test_plan_says_why_an_empty_dir_workspace_cannot_be_read() -> None:
    plan = collector.plan(_spec({"emptyDir": {}}))
    assert plan.absent and "deleted with its pod" in plan.absent


def test_stderr_between_the_lines_is_ignored_and_shown_when_the_program_failed(attempt: tuple[Path, Path]) -> None:
    lines = _run(*attempt).splitlines(keepends=True)
    noisy = b"".join([lines[0], b"DeprecationWarning: something\n", *lines[1:]])
    spool = io.BytesIO()
    collector.decode(iter([noisy]), spool)
    assert "crash-report.json" in _members(spool.getvalue())
    with pytest.raises(ValueError, match=r"no META line\); it also printed: Traceback .* / OSError: \\x1b"):
        collector.decode(iter([b"Traceback (most recent call last):\nOSError: \x1b[2J\n"]), io.BytesIO())
