"""The verdict step and retention on the S3 store: never failing or waiting because S3 is away."""

from __future__ import annotations

import json

from trainguard.core.evidence import retention
from trainguard.core.evidence.manifest import Manifest, ManifestItem, read_manifest, write_manifest

PREFIX = "runs/r1/attempt-1/"
STAMP = "2026-01-01T00:00:00+00:00"
VERDICT = json.dumps({"state": "Failed", "category": "nccl_error"}).encode()


def _collected(store) -> Manifest:
    """A bundle as a collector leaves it: two items, then the manifest."""
    items = []
    for name, data in (("crash-tail.txt", b"NCCL watchdog timeout\n"), ("snapshot/env.json", b"{}")):
        stored = store.put_bytes(PREFIX + name, data)
        items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, "test", STAMP,
                                  stored.checksum_sha256))
    manifest = Manifest("r1", 1, STAMP, tuple(items), ())
    write_manifest(store, manifest)
    return manifest


def _outcome_tags(s3, bucket: str) -> dict[str, dict[str, str]]:
    client = s3.client()
    return {key: {t["Key"]: t["Value"] for t in client.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}
            for key in s3.objects(bucket)}


def test_the_verdict_of_an_attempt_is_spooled_with_its_manifest_and_tags_when_s3_stops_after_collection(
    make_store, s3
) -> None:
    store = make_store()
    manifest = _collected(store)
    assert store.pending() == []
    s3.proxy.down()  # the server is gone between collection and the verdict

    updated = retention.add_verdict(store, manifest, VERDICT, False, "flow", STAMP)

    assert "verdict.json" in {item.name for item in updated.items}
    assert store.pending() == [PREFIX + "verdict.json", PREFIX + "manifest.json",
                               PREFIX + f"(tags {retention.OUTCOME_TAG}=failed)"]
    assert "gave up after" in store.last_error and "\n" not in store.last_error
    assert store.get_bytes(PREFIX + "verdict.json") == VERDICT  # readable from the spool meanwhile

    s3.proxy.up()
    result = make_store().flush()  # `trainguard evidence flush`, later, in another process

    assert result.pending == () and result.error == ""
    assert read_manifest(store, "r1", 1) == updated
    tags = _outcome_tags(s3, store.bucket.bucket)
    assert sorted(tags) == sorted(f"tg/{PREFIX}{name}" for name in
                                  ("crash-tail.txt", "snapshot/env.json", "verdict.json", "manifest.json"))
    assert all(found == {retention.OUTCOME_TAG: "failed"} for found in tags.values()), tags


def test_once_s3_has_failed_the_verdict_step_spools_without_calling_s3(make_store, s3) -> None:
    s3.proxy.fail(lambda method, path: method == "PUT", 503, "SlowDown")
    store = make_store()
    manifest = _collected(store)  # the first write gives up: this store now spools everything
    assert store.pending()[-1] == PREFIX + "manifest.json"
    calls_before = len(s3.proxy.requests)

    retention.add_verdict(store, manifest, VERDICT, True, "flow", STAMP)

    assert len(s3.proxy.requests) == calls_before
    assert store.pending()[-3:] == [PREFIX + "verdict.json", PREFIX + "manifest.json",
                                    PREFIX + f"(tags {retention.OUTCOME_TAG}=succeeded)"]
    assert [entry.tags for entry in store.spool.pending()] == [{retention.OUTCOME_TAG: "succeeded"}] * 6


def test_the_lifecycle_rules_are_applied_to_the_prefix_and_read_back(make_store, s3) -> None:
    store = make_store()

    applied = retention.apply_lifecycle(store, retention.Retention())

    rules = {rule["ID"]: rule for rule in s3.client().get_bucket_lifecycle_configuration(
        Bucket=store.bucket.bucket)["Rules"]}
    assert rules == {rule["ID"]: rule for rule in applied} and len(rules) == 3
    failed, succeeded = rules["trainguard-failed:tg/"], rules["trainguard-succeeded:tg/"]
    assert failed["Expiration"] == {"Days": 30} and succeeded["Expiration"] == {"Days": 7}
    assert failed["Filter"]["And"] == {"Prefix": "tg/runs/", "Tags": [{"Key": retention.OUTCOME_TAG, "Value": "failed"}]}
