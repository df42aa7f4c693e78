"""Acknowledgements and the notice file: the formats both sides share, read as hostile input.

A checkpoint's acknowledgement vouches for its files by size and SHA-256; `verify` says why the
files on disk no longer match, and neither reader raises on whatever the training job left there
(a link, a FIFO, a huge or malformed file). The entrypoint writes the notice file before it passes
a SIGTERM on, so the training reads a deadline when the signal reaches it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from entrypoint_harness import entrypoint_argv, entrypoint_env, py
from waiting import wait_for

from trainguard_entrypoint import acks
from trainguard_entrypoint.notice import Notice, give_notice, parse_notice, read_notice, write_notice


def _saved(root: Path, name: str = "step-10.pt", data: bytes = b"weights" * 100) -> acks.Ack:
    (root / name).write_bytes(data)
    ack = acks.Ack(checkpoint=name, step=10, kind="periodic", files=acks.describe_files(root, name),
                   saved_by_rank=0, world_size=4, written_at=time.time())
    acks.write_ack(root, ack)
    return ack


def test_an_ack_written_reads_back_equal_and_verifies(tmp_path: Path) -> None:
    ack = _saved(tmp_path)

    read = acks.read_ack(tmp_path, "step-10.pt")
    assert read == ack
    assert acks.verify(tmp_path, read) is None
    assert json.loads((tmp_path / ".trainguard-acks" / "step-10.pt.json").read_text())["files"][0]["size_bytes"] == 700


def test_a_folder_checkpoint_lists_every_file_and_a_file_added_or_changed_later_fails_verification(tmp_path: Path) -> None:
    (tmp_path / "step-20").mkdir()
    (tmp_path / "step-20" / "model.pt").write_bytes(b"m" * 50)
    (tmp_path / "step-20" / "optim.pt").write_bytes(b"o" * 50)
    ack = acks.Ack("step-20", 20, "notice", acks.describe_files(tmp_path, "step-20"), 0, 2, time.time())

    assert [f.name for f in ack.files] == ["step-20/model.pt", "step-20/optim.pt"]
    assert acks.verify(tmp_path, ack) is None
    (tmp_path / "step-20" / "extra.pt").write_bytes(b"x")
    assert "step-20/extra.pt is in the checkpoint but not in its acknowledgement" in (acks.verify(tmp_path, ack) or "")
    (tmp_path / "step-20" / "extra.pt").unlink()
    (tmp_path / "step-20" / "optim.pt").write_bytes(b"O" * 50)
    assert acks.verify(tmp_path, ack) == "step-20/optim.pt: SHA-256 differs from the acknowledgement's"


def test_a_truncated_file_fails_by_size_and_a_missing_one_says_so(tmp_path: Path) -> None:
    ack = _saved(tmp_path)
    (tmp_path / "step-10.pt").write_bytes(b"weights")
    assert acks.verify(tmp_path, ack) == "step-10.pt: 7 bytes, the acknowledgement says 700"
    (tmp_path / "step-10.pt").unlink()
    assert "step-10.pt: no such file" in (acks.verify(tmp_path, ack) or "")


def test_a_checkpoint_replaced_by_a_symlink_or_a_fifo_fails_without_being_followed_or_blocking(tmp_path: Path) -> None:
    ack = _saved(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.pt"
    outside.write_bytes(b"weights" * 100)  # the same bytes, outside the folder
    (tmp_path / "step-10.pt").unlink()
    (tmp_path / "step-10.pt").symlink_to(outside)
    assert "a symbolic link, not followed" in (acks.verify(tmp_path, ack) or "")
    (tmp_path / "step-10.pt").unlink()
    os.mkfifo(tmp_path / "step-10.pt")
    assert "FIFO" in (acks.verify(tmp_path, ack) or "")


@pytest.mark.parametrize("name", ["../escape.pt", "/etc/passwd", "other.pt", "step-10.pt/../../x", "step-10.pt/./a", ""])
def test_an_ack_naming_a_file_outside_its_entry_is_not_an_ack(tmp_path: Path, name: str) -> None:
    ack = _saved(tmp_path)
    payload = ack.to_json()
    payload["files"] = [{"name": name, "size_bytes": 1, "sha256": "0" * 64}]
    (tmp_path / ".trainguard-acks" / "step-10.pt.json").write_text(json.dumps(payload))

    assert acks.read_ack(tmp_path, "step-10.pt") is None


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[]", b"[" * 100_000, b'{"version": 1}',
                                     b'{"version": 1, "checkpoint": "step-10.pt", "step": -1}',
                                     b" " * (acks.ACK_LIMIT_BYTES + 1)])
def test_hostile_ack_content_reads_as_no_ack(tmp_path: Path, content: bytes) -> None:
    (tmp_path / ".trainguard-acks").mkdir()
    (tmp_path / ".trainguard-acks" / "step-10.pt.json").write_bytes(content)

    assert acks.read_ack(tmp_path, "step-10.pt") is None


def test_an_ack_that_is_a_fifo_or_a_link_reads_as_no_ack(tmp_path: Path) -> None:
    ack = _saved(tmp_path)
    real = tmp_path / ".trainguard-acks" / "step-10.pt.json"
    moved = tmp_path / "elsewhere.json"
    real.rename(moved)
    real.symlink_to(moved)
    assert acks.read_ack(tmp_path, "step-10.pt") is None
    real.unlink()
    os.mkfifo(real)
    assert acks.read_ack(tmp_path, "step-10.pt") is None
    assert acks.read_ack(tmp_path, "../step-10.pt") is None
    assert ack.checkpoint == "step-10.pt"


def test_read_acks_finds_each_wellformed_ack_and_skips_progress(tmp_path: Path) -> None:
    _saved(tmp_path, "a.pt")
    _saved(tmp_path, "b.pt")
    acks.write_progress(tmp_path, 17, "2", at=100.0)
    (tmp_path / ".trainguard-acks" / "c.pt.json").write_text("nope")

    assert sorted(acks.read_acks(tmp_path)) == ["a.pt", "b.pt"]
    assert acks.read_progress(tmp_path) == acks.Progress(17, 100.0, "2")


def test_a_notice_round_trips_and_hostile_notices_read_as_none(tmp_path: Path) -> None:
    path = tmp_path / "notice.json"
    written = give_notice(path, "eviction", 30, "kubelet SIGTERM, grace 30s", now=1000.0)
    assert read_notice(path) == written == Notice("eviction", 1000.0, 1030.0, "kubelet SIGTERM, grace 30s")
    for bad in ({"version": 1, "reason": "whim", "given_at": 1, "deadline": 2, "source": ""},
                {"version": 1, "reason": "eviction", "given_at": float("nan"), "deadline": 2, "source": ""},
                {"version": 2, "reason": "eviction", "given_at": 1, "deadline": 2, "source": ""}, [1]):
        assert parse_notice(bad) is None
    path.unlink()
    os.mkfifo(path)
    assert read_notice(path) is None
    assert read_notice(None) is None


@contextlib.contextmanager
def _ready(workspace: Path, argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """The entrypoint running ``argv`` once its command printed "ready"; the block stops it, and it must
    then end on its own (it is killed only if the block failed first)."""
    entrypoint = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = workspace / "logs" / "train-r1-attempt-1.log"
    try:
        wait_for(lambda: log.exists() and "ready" in log.read_text(), timeout=60, what="the command to start")
        yield entrypoint
        wait_for(lambda: entrypoint.poll() is not None, timeout=60, what="the entrypoint to end")
    finally:
        if entrypoint.poll() is None:
            entrypoint.kill()
            entrypoint.wait()


def test_the_entrypoint_writes_the_notice_file_before_the_command_sees_sigterm(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    seen = tmp_path / "seen.json"
    code = (
        "import json, os, signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    path = os.environ['TRAINGUARD_NOTICE_FILE']\n"
        f"    open({str(seen)!r}, 'w').write(open(path).read() if os.path.exists(path) else 'none')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    env = entrypoint_env({"TRAINGUARD_STACK_SWEEP_SECONDS": "0", "TRAINGUARD_PY_SPY": "/nonexistent/py-spy"})
    with _ready(workspace, entrypoint_argv(workspace, py(code), "--grace-seconds", "7"), env) as entrypoint:
        sent = time.time()
        entrypoint.send_signal(signal.SIGTERM)
    notice = parse_notice(json.loads(seen.read_text()))
    assert notice is not None and notice.reason == "terminated"
    assert 7 <= notice.deadline - notice.given_at < 9  # the grace, from when the command heard of the stop
    assert sent - 1 <= notice.given_at <= time.time()
    assert notice.source == "SIGTERM to the entrypoint, grace 7s"
    assert read_notice(workspace / "notice.json") == notice


def test_a_notice_already_given_by_the_backend_is_not_overwritten(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    given = tmp_path / "given.json"
    code = ("import os, time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)\n")
    env = entrypoint_env({"TRAINGUARD_STACK_SWEEP_SECONDS": "0", "TRAINGUARD_PY_SPY": "/nonexistent/py-spy",
                          "TRAINGUARD_NOTICE_FILE": str(given)})
    with _ready(workspace, entrypoint_argv(workspace, py(code)), env) as entrypoint:
        backend = Notice("eviction", time.time(), time.time() + 30, "kubelet SIGTERM, grace 30s")
        write_notice(given, backend)
        entrypoint.send_signal(signal.SIGTERM)
    assert read_notice(given) == backend
    assert not (workspace / "notice.json").exists()


def test_a_checkpoint_compared_in_full_is_not_read_again_until_a_file_of_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # collection, then the retry's listing, check the same newest checkpoint in one process
    ack = _saved(tmp_path)
    fresh = [acks.check(tmp_path, ack).hashed_bytes for _ in range(2)]
    assert fresh == [700, 700]  # written within the file clock's last ticks: read again each time

    monkeypatch.setattr(acks, "_RACY_NS", 0)  # as if written long ago
    assert [acks.check(tmp_path, ack).hashed_bytes for _ in range(2)] == [700, 0]
    (tmp_path / "swap").write_bytes(b"W" * 700)
    os.replace(tmp_path / "swap", tmp_path / "step-10.pt")  # another file in its place, the same size
    assert acks.check(tmp_path, ack).mismatch == "step-10.pt: SHA-256 differs from the acknowledgement's"
