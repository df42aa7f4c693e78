"""The S3 store when S3 misbehaves: retried when it is worth it, never losing what was written."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from s3fixtures import FAST
from waiting import wait_for

from trainguard.core.stores.s3.store import UploadPolicy
from trainguard.core.stores.s3.spool import MIN_PART_BYTES


def _puts(method: str, path: str) -> bool:
    return method == "PUT" and "/runs/" in path


def _parts(method: str, path: str) -> bool:
    return method == "PUT" and "partNumber=" in path


def test_slowdown_answers_are_retried_and_the_upload_completes(make_store, s3, tmp_path: Path) -> None:
    store = make_store()
    source = tmp_path / "train.log"
    source.write_bytes(b"step 1 loss 0.5\n" * (MIN_PART_BYTES // 8))  # two parts
    s3.proxy.fail(_parts, 503, "SlowDown", times=2)
    s3.proxy.fail(lambda m, p: m == "PUT" and p.endswith("/crash-tail.txt"), 503, "SlowDown", times=1)

    item = store.put_file("runs/r1/attempt-1/logs/train.log", source)
    store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"tail\n")

    assert store.pending() == [] and store.last_error == ""
    stored = s3.objects(store.bucket.bucket)
    assert hashlib.sha256(stored["tg/runs/r1/attempt-1/logs/train.log"]).hexdigest() == item.sha256
    assert stored["tg/runs/r1/attempt-1/crash-tail.txt"] == b"tail\n"
    assert sum(1 for m, p in s3.proxy.requests if _parts(m, p)) == 2 + 2  # two parts, two of them twice


def test_access_denied_stops_at_once_with_a_clear_line_and_keeps_the_spool(make_store, s3) -> None:
    store = make_store()
    s3.proxy.fail(_puts, 403, "AccessDenied")

    item = store.put_bytes("runs/r1/attempt-1/crash-report.json", b'{"exit_code": 1}')
    store.put_bytes("runs/r1/attempt-1/manifest.json", b"{}")

    assert "access denied" in store.last_error and "check the AWS credentials" in store.last_error
    assert "\n" not in store.last_error
    assert sum(1 for m, p in s3.proxy.requests if _puts(m, p)) == 1  # no retry, and nothing after it
    assert store.pending() == ["runs/r1/attempt-1/crash-report.json", "runs/r1/attempt-1/manifest.json"]
    assert store.get_bytes(item.key) == b'{"exit_code": 1}'  # readable from the spool meanwhile

    s3.proxy.reset()  # the policy is fixed
    result = store.flush()

    assert result.pending == () and result.error == ""
    assert set(s3.objects(store.bucket.bucket)) == {"tg/runs/r1/attempt-1/crash-report.json",
                                                     "tg/runs/r1/attempt-1/manifest.json"}


def test_a_missing_bucket_stops_at_once_and_is_named_in_the_error(make_store, s3) -> None:
    store = make_store(bucket="no-such-bucket-here")

    store.put_bytes("runs/r1/attempt-1/a", b"a")
    store.put_bytes("runs/r1/attempt-1/manifest.json", b"{}")

    assert "bucket 'no-such-bucket-here' does not exist" in store.last_error
    assert s3.proxy.requests == [("PUT", "/no-such-bucket-here/tg/runs/r1/attempt-1/a")]  # no retry, nothing after
    assert store.pending() == ["runs/r1/attempt-1/a", "runs/r1/attempt-1/manifest.json"]


def test_s3_going_down_mid_upload_keeps_everything_spooled_and_flush_resumes_it(make_store, s3, tmp_path) -> None:
    store = make_store()
    data = bytes(range(256)) * (3 * MIN_PART_BYTES // 256)  # three parts
    (tmp_path / "core").write_bytes(data)
    s3.proxy.hold(lambda m, p: _parts(m, p) and "partNumber=3" in p)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (store.put_file("runs/r1/attempt-1/core", tmp_path / "core"), done.set()))
    worker.start()
    wait_for(s3.proxy.held.is_set, what="the third part to reach the proxy")
    wait_for(lambda: sum(1 for m, p in s3.proxy.requests if _parts(m, p)) == 2, what="parts 1 and 2 to be sent")
    s3.proxy.down()
    worker.join(30)
    store.put_bytes("runs/r1/attempt-1/manifest.json", b'{"items": ["core"]}')

    assert done.is_set() and store.pending() == ["runs/r1/attempt-1/core", "runs/r1/attempt-1/manifest.json"]
    assert "gave up after" in store.last_error
    assert store.get_bytes("runs/r1/attempt-1/manifest.json") == b'{"items": ["core"]}'
    assert s3.objects(store.bucket.bucket) == {}  # nothing half-there, and no manifest before its items

    s3.proxy.up()
    s3.proxy.requests.clear()
    result = make_store().flush()  # a later process, e.g. `trainguard evidence flush`

    assert result.pending == () and result.uploaded == ("runs/r1/attempt-1/core", "runs/r1/attempt-1/manifest.json")
    sent = [p for m, p in s3.proxy.requests if m in ("PUT", "POST")]
    assert [p for p in sent if "partNumber=" in p] == [p for p in sent if "partNumber=3" in p]  # only the lost part
    assert sent[-1].endswith("/manifest.json")  # the manifest goes last
    assert s3.objects(store.bucket.bucket) == {"tg/runs/r1/attempt-1/core": data,
                                                "tg/runs/r1/attempt-1/manifest.json": b'{"items": ["core"]}'}
    assert s3.client().list_multipart_uploads(Bucket=store.bucket.bucket).get("Uploads", []) == []


def test_a_file_that_changes_while_it_uploads_is_spooled_as_it_is_now_and_flush_sends_that(make_store, s3, tmp_path) -> None:
    store = make_store()
    source = tmp_path / "train.log"
    source.write_bytes(b"step 1 loss 0.5\n" * (MIN_PART_BYTES // 8))  # two parts
    s3.proxy.hold(lambda m, p: _parts(m, p) and "partNumber=2" in p)
    worker = threading.Thread(target=lambda: store.put_file("runs/r1/attempt-1/logs/train.log", source))
    worker.start()
    wait_for(s3.proxy.held.is_set, what="part 2 to reach the proxy")
    with source.open("ab") as out:
        out.write(b"step 2 loss 0.4\n")  # the training process was still writing
    s3.proxy.release()
    worker.join(30)

    assert store.pending() == ["runs/r1/attempt-1/logs/train.log"] and "changed while it was uploaded" in store.last_error
    assert store.flush().pending == ()
    assert s3.objects(store.bucket.bucket) == {"tg/runs/r1/attempt-1/logs/train.log": source.read_bytes()}
    assert s3.client().list_multipart_uploads(Bucket=store.bucket.bucket).get("Uploads", []) == []


def test_when_the_time_budget_is_spent_writes_stay_spooled_without_calling_s3(make_store, s3) -> None:
    now = [0.0]
    policy = UploadPolicy(attempts=3, base_delay_seconds=1, max_delay_seconds=1, budget_seconds=10,
                          part_bytes=MIN_PART_BYTES)
    store = make_store(policy=policy, clock=lambda: now[0])
    store.put_bytes("runs/r1/attempt-1/a", b"a")
    now[0] = 11.0
    s3.proxy.requests.clear()

    store.put_bytes("runs/r1/attempt-1/b", b"b")

    assert store.pending() == ["runs/r1/attempt-1/b"] and "upload time budget (10 s) is spent" in store.last_error
    assert s3.proxy.requests == []


def test_a_rewritten_key_still_waiting_is_uploaded_once_in_its_newest_form(make_store, s3) -> None:
    s3.proxy.fail(_puts, 503, "ServiceUnavailable", times=FAST.attempts)
    store = make_store()
    store.put_bytes("runs/r1/attempt-1/manifest.json", b"v1")
    store.put_bytes("runs/r1/attempt-1/verdict.json", b"failed")
    store.put_bytes("runs/r1/attempt-1/manifest.json", b"v2")
    assert len(store.pending()) == 3
    s3.proxy.requests.clear()

    store.flush()

    puts = [p.rsplit("/", 1)[1] for m, p in s3.proxy.requests if _puts(m, p)]
    assert puts == ["verdict.json", "manifest.json"]
    assert s3.objects(store.bucket.bucket)["tg/runs/r1/attempt-1/manifest.json"] == b"v2"
