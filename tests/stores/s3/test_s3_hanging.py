"""The S3 store when S3 hangs or answers slowly: an attempt's writes wait on it no longer than the budget."""

from __future__ import annotations

import hashlib
import sys
import threading

from s3fixtures import FAST
from waiting import wait_for

from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
from trainguard.core.stores.s3.store import S3Store, UploadPolicy
from trainguard.core.stores.s3.spool import MIN_PART_BYTES, Spool

# the production retry settings (5 tries, 0.5 s first backoff), with a budget a test can wait out
DEFAULT_RETRIES_SHORT_BUDGET = UploadPolicy(budget_seconds=0.5, part_bytes=MIN_PART_BYTES, concurrency=3)


def _writes(method: str, path: str) -> bool:
    return method in ("PUT", "POST") and "/runs/" in path


def test_a_hanging_s3_keeps_writes_no_longer_than_the_budget_and_flush_completes_them(make_store, s3, tmp_path) -> None:
    data = bytes(range(256)) * (2 * MIN_PART_BYTES // 256)  # two parts
    (tmp_path / "core").write_bytes(data)
    s3.proxy.hold(_writes, every=True)
    # a read timeout past the proxy's hold: only the budget can end the wait
    store = make_store(policy=DEFAULT_RETRIES_SHORT_BUDGET, read_timeout_seconds=120)

    store.put_file("runs/r1/attempt-1/core", tmp_path / "core")
    store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"tail\n")
    store.put_bytes("runs/r1/attempt-1/manifest.json", b'{"items": ["core", "crash-tail.txt"]}')

    assert s3.proxy.holding == s3.proxy.held_total >= 1  # S3 answered none of them: the store moved on without it
    assert store.pending() == ["runs/r1/attempt-1/core", "runs/r1/attempt-1/crash-tail.txt",
                               "runs/r1/attempt-1/manifest.json"]
    assert "upload time budget (0.5 s) is spent" in store.last_error and "next attempt" in store.last_error

    s3.proxy.reset()  # S3 answers again; what was held goes through or is dropped
    wait_for(lambda: s3.proxy.holding == 0, what="the held requests to end")
    result = make_store().flush()

    assert result.pending == () and result.error == ""
    stored = s3.objects(store.bucket.bucket)
    assert hashlib.sha256(stored["tg/runs/r1/attempt-1/core"]).digest() == hashlib.sha256(data).digest()
    assert stored["tg/runs/r1/attempt-1/manifest.json"] == b'{"items": ["core", "crash-tail.txt"]}'
    assert list((tmp_path / "spool").glob("*.data")) == []
    # the upload S3 started once it answered again is aborted by the call left behind: nothing lingers
    wait_for(lambda: s3.client().list_multipart_uploads(Bucket=store.bucket.bucket).get("Uploads", []) == [],
             what="the abandoned multipart upload to be aborted")


def test_a_write_uploads_only_its_own_runs_backlog_first(make_store, s3) -> None:
    s3.proxy.fail(_writes, 503, "ServiceUnavailable", times=2 * FAST.attempts)
    make_store().put_bytes("runs/other/attempt-1/crash-tail.txt", b"other run")  # spooled: S3 was away
    make_store().put_bytes("runs/r1/attempt-1/crash-tail.txt", b"r1, earlier")
    s3.proxy.reset()
    store = make_store()

    store.put_bytes("runs/r1/attempt-2/crash-tail.txt", b"r1, now")

    assert store.pending() == ["runs/other/attempt-1/crash-tail.txt"]  # for flush, or that run's next write
    sent = [p.split("/tg/", 1)[1] for m, p in s3.proxy.requests if _writes(m, p)]
    assert sent == ["runs/r1/attempt-1/crash-tail.txt", "runs/r1/attempt-2/crash-tail.txt"]

    make_store().put_bytes("runs/other/attempt-2/crash-tail.txt", b"other, now")

    assert store.pending() == [] and len(s3.objects(store.bucket.bucket)) == 4


def test_a_read_timeout_is_retried_and_the_upload_completes(make_store, s3) -> None:
    s3.proxy.hold(lambda m, p: _writes(m, p) and p.endswith("/crash-tail.txt"))  # the first try only
    store = make_store(read_timeout_seconds=0.5)

    store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"tail\n")

    assert store.pending() == [] and store.last_error == ""
    assert s3.proxy.holding == 1  # the first try still waits at the proxy: the retry stored the object
    assert sum(1 for m, p in s3.proxy.requests if _writes(m, p)) == 1
    assert s3.objects(store.bucket.bucket) == {"tg/runs/r1/attempt-1/crash-tail.txt": b"tail\n"}


def test_a_held_store_sends_nothing_until_upload_held_and_a_later_upload_waits_for_an_earlier_one(
    make_store, s3, tmp_path
) -> None:
    (tmp_path / "core").write_bytes(b"\x7fELF core" * 1000)
    first, second = make_store(), make_store()
    first.hold(), second.hold()
    asked = len(s3.proxy.requests)
    first.put_file("runs/r1/attempt-1/core", tmp_path / "core")
    first.put_bytes("runs/r1/attempt-1/manifest.json", b'{"attempt": 1}')
    second.put_bytes("runs/r1/attempt-2/manifest.json", b'{"attempt": 2}')
    assert len(s3.proxy.requests) == asked  # held: spooled, and S3 not asked anything
    assert first.pending() == ["runs/r1/attempt-1/core", "runs/r1/attempt-1/manifest.json",
                               "runs/r1/attempt-2/manifest.json"]

    s3.proxy.hold(_writes)  # the first upload's first request waits, keeping the spool's upload lock
    ended: list = []
    earlier = threading.Thread(target=lambda: ended.append(first.upload_held("runs/r1/")))
    earlier.start()
    wait_for(s3.proxy.held.is_set, what="the earlier upload under way")
    later = threading.Thread(target=lambda: ended.append(second.upload_held("runs/r1/", wait_seconds=60)))
    later.start()
    wait_for(lambda: _in_function(later, "_lock_within"), what="the later upload waiting for the spool's lock")
    assert s3.proxy.held_total == 1 and not ended  # it waits there rather than giving up
    s3.proxy.release()
    earlier.join(30), later.join(30)

    assert [result.pending for result in ended] == [(), ()] and second.last_error == ""
    keys = [path for method, path in s3.proxy.requests[asked:] if method == "PUT" and "manifest.json" in path]
    assert [key.split("/")[-2] for key in keys] == ["attempt-1", "attempt-2"]  # manifests last, in order


def _in_function(thread: threading.Thread, name: str) -> bool:
    """Whether ``thread`` is running ``name`` now (somewhere on its stack)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


def test_a_held_item_the_spool_has_no_room_for_goes_straight_to_s3(s3, small_disk, tmp_path) -> None:
    data = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB: more than the 2 MB disk the spool is on
    (tmp_path / "core").write_bytes(data)
    settings = S3Settings(bucket=s3.new_bucket(), region="us-east-1", endpoint_url=s3.proxy.url)
    store = S3Store(S3Bucket(settings), "tg", Spool(small_disk / "spool"), FAST)
    store.hold()

    item = store.put_file("runs/r1/attempt-1/core", tmp_path / "core")
    store.put_bytes("runs/r1/attempt-1/manifest.json", b'{"items": ["core"]}')  # small: it fits

    assert item.sha256 == hashlib.sha256(data).hexdigest()
    assert s3.objects(settings.bucket) == {"tg/runs/r1/attempt-1/core": data}  # the manifest waits, held
    assert store.pending() == ["runs/r1/attempt-1/manifest.json"] and len(list((small_disk / "spool").glob("*.data"))) == 1
    assert store.upload_held("runs/r1/").pending == ()
    assert set(s3.objects(settings.bucket)) == {"tg/runs/r1/attempt-1/core", "tg/runs/r1/attempt-1/manifest.json"}
