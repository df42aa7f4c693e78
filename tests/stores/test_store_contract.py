"""The evidence-store contract: the same behaviour from the local folder store and the S3 store."""

from __future__ import annotations

import hashlib
import urllib.request
from pathlib import Path

import pytest

from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, EvidenceStoreError
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.stores.s3.spool import MIN_PART_BYTES


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path: Path) -> EvidenceStore:
    if request.param == "local":
        return LocalEvidenceStore(tmp_path / "evidence")
    return request.getfixturevalue("make_store")()


def test_both_stores_implement_the_protocol(store) -> None:
    assert isinstance(store, EvidenceStore)


def test_put_bytes_then_get_bytes_round_trips_with_the_sha256(store) -> None:
    item = store.put_bytes("runs/r1/attempt-1/crash-report.json", b'{"exit_code": 139}')

    assert (item.key, item.sha256, item.size_bytes) == (
        "runs/r1/attempt-1/crash-report.json", hashlib.sha256(b'{"exit_code": 139}').hexdigest(), 18)
    assert store.get_bytes(item.key) == b'{"exit_code": 139}'
    assert store.exists(item.key) and not store.exists("runs/r1/attempt-1/other")


def test_a_file_larger_than_several_parts_streams_in_and_out_intact(store, tmp_path: Path) -> None:
    data = hashlib.sha256(b"seed").digest() * ((2 * MIN_PART_BYTES + 12345) // 32)
    source = tmp_path / "core.1234"
    source.write_bytes(data)

    item = store.put_file("runs/r1/attempt-1/coredumps/core.1234", source)

    assert (item.sha256, item.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert store.head(item.key).size_bytes == len(data)
    assert b"".join(store.read_chunks(item.key)) == data


def test_rewriting_a_key_replaces_the_object(store) -> None:
    store.put_bytes("runs/r1/attempt-1/manifest.json", b"first")
    store.put_bytes("runs/r1/attempt-1/manifest.json", b"second")

    assert store.get_bytes("runs/r1/attempt-1/manifest.json") == b"second"
    assert store.list_keys("runs/") == ["runs/r1/attempt-1/manifest.json"]


def test_list_keys_is_a_sorted_string_prefix_match(store) -> None:
    for key in ("runs/r1/attempt-2/b", "runs/r1/attempt-1/a", "runs/r10/attempt-1/c", "other/d"):
        store.put_bytes(key, b"")

    assert store.list_keys("runs/r1/") == ["runs/r1/attempt-1/a", "runs/r1/attempt-2/b"]
    assert store.list_keys("runs/r1") == ["runs/r1/attempt-1/a", "runs/r1/attempt-2/b", "runs/r10/attempt-1/c"]
    assert store.list_keys("nowhere/") == []


def test_reading_a_missing_key_raises_evidence_not_found(store) -> None:
    with pytest.raises(EvidenceNotFound):
        store.get_bytes("runs/r1/attempt-1/nothing")
    with pytest.raises(EvidenceNotFound):
        store.head("runs/r1/attempt-1/nothing")
    with pytest.raises(EvidenceNotFound):
        b"".join(store.read_chunks("runs/r1/attempt-1/nothing"))


@pytest.mark.parametrize("key", ["", "/etc/passwd", "runs/../x", "runs//r1", "runs/.hidden", "a\\b"])
def test_bad_keys_are_refused_with_one_line(store, key: str) -> None:
    with pytest.raises(EvidenceStoreError) as caught:
        store.put_bytes(key, b"x")
    assert "\n" not in str(caught.value)


def test_delete_removes_the_object_and_deleting_it_again_is_fine(store) -> None:
    store.put_bytes("runs/r1/attempt-1/a", b"a")
    store.put_bytes("runs/r1/attempt-1/b", b"b")

    store.delete("runs/r1/attempt-1/a")
    store.delete("runs/r1/attempt-1/a")

    assert store.list_keys("runs/") == ["runs/r1/attempt-1/b"]


def test_a_link_fetches_the_object_without_the_store(store) -> None:
    store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"CUDA out of memory\n")

    with urllib.request.urlopen(store.link("runs/r1/attempt-1/crash-tail.txt", 300), timeout=10) as answer:
        assert answer.read() == b"CUDA out of memory\n"


def test_describe_names_where_the_object_is(store) -> None:
    where = store.describe("runs/r1/attempt-1")
    assert where.endswith("runs/r1/attempt-1") and ("s3://" in where or Path(where).is_absolute())
