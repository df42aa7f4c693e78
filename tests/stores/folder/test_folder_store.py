"""The local evidence store over real files and real threads."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, EvidenceStoreError, StoredItem
from trainguard.core.stores.folder import LocalEvidenceStore


@pytest.fixture
def store(tmp_path: Path) -> LocalEvidenceStore:
    return LocalEvidenceStore(tmp_path / "evidence")


def _files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_the_local_store_implements_the_protocol(store) -> None:
    assert isinstance(store, EvidenceStore)


def test_put_bytes_returns_the_sha256_and_size_and_get_bytes_reads_it_back(store) -> None:
    item = store.put_bytes("runs/r1/attempt-1/crash-report.json", b'{"exit_code": 139}')

    assert item == StoredItem("runs/r1/attempt-1/crash-report.json", hashlib.sha256(b'{"exit_code": 139}').hexdigest(), 18)
    assert store.get_bytes(item.key) == b'{"exit_code": 139}'
    assert store.exists(item.key)


def test_put_file_streams_a_large_file_with_the_right_digest(store, tmp_path: Path) -> None:
    source = tmp_path / "step-000120.pt"
    data = bytes(range(256)) * (3 * 4096 + 7)  # a few MiB, more than one chunk
    source.write_bytes(data)

    item = store.put_file("runs/r1/attempt-1/checkpoint/step-000120.pt", source)

    assert (item.sha256, item.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert store.get_bytes(item.key) == data


def test_writes_leave_no_temporary_files_behind(store) -> None:
    for i in range(5):
        store.put_bytes(f"runs/r1/attempt-1/logs/part-{i}.log", b"x" * i)
    store.put_bytes("runs/r1/attempt-1/logs/part-0.log", b"rewritten")

    assert _files_under(store.root) == [f"runs/r1/attempt-1/logs/part-{i}.log" for i in range(5)]
    assert store.get_bytes("runs/r1/attempt-1/logs/part-0.log") == b"rewritten"


def test_a_write_interrupted_midway_leaves_neither_object_nor_temp_file(store) -> None:
    def failing_write(out):
        out.write(b"half of a core dump")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store._write("runs/r1/attempt-1/coredumps/core", failing_write, 0)

    assert not store.exists("runs/r1/attempt-1/coredumps/core")
    assert _files_under(store.root) == []


def test_a_reader_listing_during_writes_never_sees_a_half_written_object(store) -> None:
    size = 2 * 1024 * 1024
    seen_bad: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            for key in store.list_keys("runs/"):
                data = store.get_bytes(key)
                if len(data) != size or len(set(data)) != 1:
                    seen_bad.append(key)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(12):
            store.put_bytes(f"runs/r1/attempt-1/blob-{i}", bytes([i]) * size)
    finally:
        done.set()
        thread.join()

    assert seen_bad == []
    assert len(store.list_keys("runs/")) == 12


@pytest.mark.parametrize(
    ("key", "complaint"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("runs/../../etc/passwd", "'..'"),
        ("runs//r1", "''"),
        ("runs/./r1", "'.'"),
        ("runs/r1/", "''"),
        ("runs\\r1", "backslash"),
        ("runs/.hidden", "reserved for temporary files"),
        ("a" * 2000, "longer than"),
    ],
)
def test_bad_keys_are_refused_with_one_line_saying_why(store, key: str, complaint: str) -> None:
    with pytest.raises(EvidenceStoreError) as caught:
        store.put_bytes(key, b"x")

    assert complaint in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not store.root.exists() or _files_under(store.root) == []


def test_reading_a_missing_key_raises_evidence_not_found(store) -> None:
    with pytest.raises(EvidenceNotFound, match="runs/r1/attempt-1/nothing"):
        store.get_bytes("runs/r1/attempt-1/nothing")
    assert not store.exists("runs/r1/attempt-1/nothing")


def test_list_keys_is_a_string_prefix_match_like_an_object_store(store) -> None:
    for key in ("runs/r1/attempt-1/a", "runs/r1/attempt-2/b", "runs/r10/attempt-1/c", "other/d"):
        store.put_bytes(key, b"")

    assert store.list_keys("runs/r1/") == ["runs/r1/attempt-1/a", "runs/r1/attempt-2/b"]
    assert store.list_keys("runs/r1") == ["runs/r1/attempt-1/a", "runs/r1/attempt-2/b", "runs/r10/attempt-1/c"]
    assert store.list_keys("") == ["other/d", "runs/r1/attempt-1/a", "runs/r1/attempt-2/b", "runs/r10/attempt-1/c"]
    assert store.list_keys("nowhere/") == []


def test_a_key_that_clashes_with_an_existing_object_is_a_store_error(store) -> None:
    store.put_bytes("runs/r1/attempt-1", b"a file where a folder is needed")

    with pytest.raises(EvidenceStoreError, match="cannot write 'runs/r1/attempt-1/x'"):
        store.put_bytes("runs/r1/attempt-1/x", b"")


def test_describe_gives_a_path_a_person_can_open(store) -> None:
    assert store.describe() == str(store.root)
    assert store.describe("runs/r1/attempt-1/") == str(store.root / "runs" / "r1" / "attempt-1")
