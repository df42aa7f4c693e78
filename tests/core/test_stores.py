"""The local evidence store and the manifest, over real files and real threads."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from trainguard.core.evidence.manifest import (
    add_items,
    Manifest,
    ManifestError,
    ManifestItem,
    MissingItem,
    attempt_prefix,
    read_manifest,
    write_verdict,
    release_space,
    reserve_space,
    storage_failures,
    store_manifest,
    verify_manifest,
    write_manifest,
)
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
    def failing_chunks():
        yield b"half of a core dump"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store._write("runs/r1/attempt-1/coredumps/core", failing_chunks, 0)

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


def _manifest(store: LocalEvidenceStore) -> Manifest:
    prefix = attempt_prefix("r1", 2)
    items = []
    for name, data in (("crash-report.json", b"{}"), ("logs/train-r1-attempt-2.log", b"loss=nan\n")):
        stored = store.put_bytes(f"{prefix}/{name}", data)
        items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, "entrypoint", "2026-01-01T00:00:00+00:00"))
    missing = (MissingItem("coredumps", "entrypoint", "SIGTERM does not produce a core dump"),)
    return Manifest("r1", 2, "2026-01-01T00:00:01+00:00", tuple(items), missing)


def test_a_manifest_round_trips_through_the_store_and_verifies(store) -> None:
    manifest = _manifest(store)
    stored = write_manifest(store, manifest)

    assert stored.key == "runs/r1/attempt-2/manifest.json"
    assert read_manifest(store, "r1", 2) == manifest
    assert verify_manifest(store, manifest) == []


def test_added_items_are_listed_in_the_rewritten_manifest_and_replace_their_namesakes(store) -> None:
    write_manifest(store, _manifest(store))

    add_items(store, "r1", 2, {"verdict.json": b'{"category": "divergence"}'}, "flow", "2026-01-01T00:00:02+00:00")
    updated = add_items(store, "r1", 2, {"verdict.json": b'{"category": "nccl_error"}'}, "flow", "2026-01-01T00:00:03+00:00")

    assert read_manifest(store, "r1", 2) == updated
    assert [item.name for item in updated.items].count("verdict.json") == 1
    assert store.get_bytes("runs/r1/attempt-2/verdict.json") == b'{"category": "nccl_error"}'
    assert verify_manifest(store, updated) == [] and updated.missing == _manifest(store).missing


def test_verify_manifest_catches_a_tampered_and_a_vanished_object(store) -> None:
    manifest = _manifest(store)
    (store.root / "runs/r1/attempt-2/logs/train-r1-attempt-2.log").write_bytes(b"loss=0.1\n")
    (store.root / "runs/r1/attempt-2/crash-report.json").unlink()

    problems = verify_manifest(store, manifest)

    assert problems[0] == "runs/r1/attempt-2/crash-report.json: missing from the store"
    assert problems[1].startswith("runs/r1/attempt-2/logs/train-r1-attempt-2.log: sha256 is ")
    assert len(problems) == 2  # same size, different bytes: only the digest differs


def test_verify_manifest_reports_a_size_mismatch(store) -> None:
    manifest = _manifest(store)
    (store.root / "runs/r1/attempt-2/crash-report.json").write_bytes(b"{ }")

    assert "runs/r1/attempt-2/crash-report.json: size is 3 bytes, the manifest says 2" in verify_manifest(store, manifest)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"run_id": "r1", "attempt": "2", "created_at": "t", "items": [], "missing": []}', "'attempt'"),
        ('{"run_id": "r1", "attempt": 2, "created_at": "t", "items": [{"name": "x"}], "missing": []}', "'items'"),
        ('{"run_id": "r1", "attempt": 2, "created_at": "t", "items": []}', "'missing'"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(ManifestError, match=named):
        Manifest.from_json(text)


def test_attempt_prefix_refuses_unsafe_run_ids() -> None:
    assert attempt_prefix("llama-ft", 3) == "runs/llama-ft/attempt-3"
    with pytest.raises(ValueError, match="run_id"):
        attempt_prefix("../x", 1)
    with pytest.raises(ValueError, match="attempt"):
        attempt_prefix("r1", 0)


def _fill(disk: Path) -> None:
    """Write into ``disk`` until it says it is full."""
    with (disk / "filler").open("wb") as out:
        with pytest.raises(OSError, match="No space left"):
            while True:
                out.write(b"x" * 65536)
                out.flush()


def test_a_full_disk_still_takes_the_manifest_and_verdict_it_set_space_aside_for(small_disk: Path) -> None:
    store = LocalEvidenceStore(small_disk / "evidence")
    assert reserve_space(store, "r1", 1) is None
    _fill(small_disk)
    with pytest.raises(EvidenceStoreError, match="No space left on device"):
        store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"t" * 20_000)  # not reserved: refused
    manifest = store_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (), (
        MissingItem("crash-tail.txt", "local-workspace", "could not collect: EvidenceStoreError: no space"),)), "flow")

    assert write_verdict(store, "r1", 1, b'{"category": "code_error"}' * 500, "flow", "2026-01-01T00:00:01+00:00") is None
    kept = read_manifest(store, "r1", 1)
    assert [item.name for item in kept.items] == ["verdict.json"] and kept.missing == manifest.missing
    assert storage_failures(kept) == ["evidence crash-tail.txt: EvidenceStoreError: no space"]
    release_space(store, "r1", 1)
    assert store.list_keys("runs/") == ["runs/r1/attempt-1/manifest.json", "runs/r1/attempt-1/verdict.json"]
    assert sorted(p.name for p in (small_disk / "evidence/runs/r1/attempt-1").iterdir()) == ["manifest.json", "verdict.json"]


def test_without_space_set_aside_a_lost_manifest_and_verdict_are_reported_not_raised(small_disk: Path) -> None:
    store = LocalEvidenceStore(small_disk / "evidence")
    _fill(small_disk)
    assert "No space left on device" in (reserve_space(store, "r1", 1) or "")
    manifest = store_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (), ()), "flow")

    problem = write_verdict(store, "r1", 1, b"{}" * 5000, "flow", "2026-01-01T00:00:01+00:00")
    assert [item.name for item in manifest.missing] == ["manifest.json"]
    assert storage_failures(manifest)[0].startswith("evidence manifest.json: could not store the manifest")
    assert problem is not None and problem.startswith("verdict.json could not be stored") and "No space" in problem
