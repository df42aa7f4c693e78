"""Listing the checkpoint folder: sizes, times and digests, without stalling the crash report."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from entrypoint_harness import py

from trainguard_entrypoint.checkpoints import MAX_ENTRIES, list_checkpoints


def test_checkpoint_digests_favour_the_newest_files_within_the_budget(tmp_path: Path) -> None:
    for step, mtime in ((1, 100), (2, 200), (3, 300)):
        path = tmp_path / f"step-{step}.pt"
        path.write_bytes(b"x" * 100)
        os.utime(path, (mtime, mtime))
    (tmp_path / "huge.bin").write_bytes(b"y" * 500)

    files = {f["name"]: f for f in list_checkpoints(tmp_path, hash_limit_bytes=400, hash_budget_bytes=250)["files"]}

    assert files["step-3.pt"]["sha256"] and files["step-2.pt"]["sha256"]
    assert files["step-1.pt"]["sha256"] is None
    assert "budget" in files["step-1.pt"]["sha256_skipped"]
    assert files["huge.bin"]["sha256_skipped"] == "larger than 400 bytes"


def test_a_digest_the_caller_already_took_is_used_and_counts_against_the_budget_the_same(tmp_path: Path) -> None:
    for step, mtime in ((1, 100), (2, 200), (3, 300)):
        path = tmp_path / f"step-{step}.pt"
        path.write_bytes(b"x" * 100)
        os.utime(path, (mtime, mtime))
    taken = "ab" * 32  # not the file's digest: only a listing that never read step-3.pt again says it

    files = {f["name"]: f for f in list_checkpoints(tmp_path, hash_limit_bytes=400, hash_budget_bytes=250,
                                                    known={"step-3.pt": taken})["files"]}

    assert files["step-3.pt"]["sha256"] == taken
    assert files["step-2.pt"]["sha256"] == hashlib.sha256(b"x" * 100).hexdigest()
    assert files["step-1.pt"]["sha256"] is None and "budget" in files["step-1.pt"]["sha256_skipped"]


def test_a_missing_checkpoint_folder_is_listed_as_absent_with_why(tmp_path: Path) -> None:
    listing = list_checkpoints(tmp_path / "none")

    assert listing == {"dir": str(tmp_path / "none"), "files": [], "absent": f"no such directory: {tmp_path / 'none'}"}


def test_nested_checkpoint_files_are_listed_with_relative_names_and_digests(tmp_path: Path) -> None:
    (tmp_path / "step-10" / "shards").mkdir(parents=True)
    (tmp_path / "step-10" / "shards" / "rank0.bin").write_bytes(b"r0")

    (entry,) = list_checkpoints(tmp_path)["files"]

    assert entry["name"] == "step-10/shards/rank0.bin"
    assert (entry["size_bytes"], entry["sha256"]) == (2, hashlib.sha256(b"r0").hexdigest())
    assert entry["mtime"].endswith("+00:00")


def test_a_checkpoint_folder_of_many_thousand_files_is_listed_up_to_the_limit_and_says_how_many_it_left_out(
        tmp_path: Path) -> None:
    for index in range(MAX_ENTRIES + 1_500):
        os.close(os.open(tmp_path / f"shard-{index:06d}.pt", os.O_CREAT | os.O_WRONLY, 0o600))

    listing = list_checkpoints(tmp_path)

    assert len(listing["files"]) == MAX_ENTRIES == 5_000
    assert listing["files"][-1]["name"] == f"shard-{MAX_ENTRIES - 1:06d}.pt"
    assert listing["left_out"] == 1_500 and "1500 entries not listed" in listing["truncated"]


def test_links_fifos_and_devices_in_the_checkpoint_folder_are_skipped_with_why_and_never_read(tmp_path: Path) -> None:
    host = tmp_path / "host-secret"
    host.write_bytes(b"host bytes")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "step-1.pt").write_bytes(b"w1")
    (folder / "step-2.pt").symlink_to(host)
    os.mkfifo(folder / "step-3.pt")  # hashing it would wait for a writer forever
    if os.geteuid() == 0:
        os.mknod(folder / "step-4.pt", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: endless

    listing = list_checkpoints(folder)

    assert [f["name"] for f in listing["files"]] == ["step-1.pt"]
    skipped = {entry["name"]: entry["kind"] for entry in listing["skipped"]}
    assert skipped["step-2.pt"] == "symlink" and skipped["step-3.pt"] == "fifo"
    assert skipped.get("step-4.pt", "device") == "device"


def test_a_fifo_left_in_the_checkpoint_folder_does_not_hold_up_the_entrypoint(run_entrypoint, tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    code = f"import os; os.makedirs({str(folder)!r}); os.mkfifo({str(folder / 'step-9.pt')!r}); raise SystemExit(3)"

    run = run_entrypoint(py(code), "--checkpoint-dir", str(folder), timeout=60)

    assert run.returncode == 3
    assert run.report["checkpoints"]["skipped"][0]["kind"] == "fifo"
