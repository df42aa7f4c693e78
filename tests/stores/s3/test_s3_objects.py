"""What the S3 store leaves in the bucket: encrypted, private, with S3's own SHA-256 checksum."""

from __future__ import annotations

import base64
import hashlib

import pytest

from trainguard.core.stores.s3.spool import MIN_PART_BYTES
from trainguard.core.stores.base import EvidenceStoreError


def test_objects_are_encrypted_private_and_carry_their_sha256(make_store, s3) -> None:
    store = make_store()
    item = store.put_bytes("runs/r1/attempt-1/env.json", b'{"PATH": "/usr/bin"}')

    head = s3.client().head_object(Bucket=store.bucket.bucket, Key="tg/" + item.key, ChecksumMode="ENABLED")
    acl = s3.client().get_object_acl(Bucket=store.bucket.bucket, Key="tg/" + item.key)

    assert head["ServerSideEncryption"] == "AES256"
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(b'{"PATH": "/usr/bin"}').digest()).decode()
    assert item.checksum_sha256 == head["ChecksumSHA256"]
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    assert acl["Grants"][0]["Grantee"]["Type"] == "CanonicalUser"


def test_a_multipart_object_records_the_composite_checksum_s3_keeps(make_store, s3, tmp_path) -> None:
    data = b"x" * (2 * MIN_PART_BYTES + 1)
    (tmp_path / "ckpt").write_bytes(data)
    store = make_store()

    item = store.put_file("runs/r1/attempt-1/checkpoint/ckpt", tmp_path / "ckpt")

    parts = [data[:MIN_PART_BYTES], data[MIN_PART_BYTES:2 * MIN_PART_BYTES], data[2 * MIN_PART_BYTES:]]
    composite = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()
    assert item.checksum_sha256 == base64.b64encode(composite).decode() + "-3"
    attributes = s3.client().get_object_attributes(Bucket=store.bucket.bucket, Key="tg/" + item.key,
                                                   ObjectAttributes=["Checksum", "ObjectSize"])
    assert attributes["Checksum"]["ChecksumSHA256"] == item.checksum_sha256.split("-")[0]
    assert store.head(item.key).checksum_sha256.split("-")[0] == item.checksum_sha256.split("-")[0]


def test_spooled_data_changed_on_disk_is_refused_not_uploaded(make_store, s3) -> None:
    s3.proxy.fail(lambda m, p: m == "PUT" and "/runs/" in p, 503, "SlowDown", times=100)
    store = make_store()
    store.put_bytes("runs/r1/attempt-1/a", b"original")
    entry = store.spool.pending()[0]
    store.spool.data_path(entry).write_bytes(b"tampered")
    s3.proxy.reset()

    result = store.flush()

    assert "changed on disk since it was spooled" in result.error and result.pending == ("runs/r1/attempt-1/a",)
    assert s3.objects(store.bucket.bucket) == {}


def test_an_unreadable_source_file_is_a_store_error_naming_it(make_store, tmp_path) -> None:
    with pytest.raises(EvidenceStoreError, match="cannot read .*nothing-here"):
        make_store().put_file("runs/r1/attempt-1/x", tmp_path / "nothing-here")
