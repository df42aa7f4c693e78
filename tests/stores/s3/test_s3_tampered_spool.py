"""The S3 store's spool tampered with: a training job runs as the flow's user and can write the spool folder.

What waits there is read, uploaded and shown only from regular files of the spool's own: a link put
in place of spooled data is never followed (so a host file is neither shown nor uploaded to S3), and
a FIFO put in place of data, of a record or of a lock never holds a read, a flush or a write up.
Each write below stays spooled because the bucket refuses it (moto behind the fault proxy, 403).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile import within

from trainguard.core.stores.base import EvidenceStoreError

HOST = b"HOST-ONLY-BYTES-3c9e\n" * 50
KEY = "runs/r1/attempt-1/logs/train.log"


def _puts(method: str, path: str) -> bool:
    return method == "PUT" and "/runs/" in path


@pytest.fixture
def spooled(make_store, s3, tmp_path: Path):
    """(store, the spooled log's data file, a host file) for a log S3 refused, so it waits in the spool."""
    store = make_store()
    s3.proxy.fail(_puts, 403, "AccessDenied")
    store.put_bytes(KEY, b"step 1 loss 0.5\n" * 100)
    (entry,) = store.spool.pending()
    host = tmp_path / "host" / "credentials"
    host.parent.mkdir()
    host.write_bytes(HOST)
    return store, store.spool.data_path(entry), host


def test_a_link_in_place_of_spooled_data_is_neither_shown_nor_uploaded(spooled, s3) -> None:
    store, data, host = spooled
    data.unlink()
    data.symlink_to(host)
    s3.proxy.reset()

    with pytest.raises(EvidenceStoreError, match="symbolic link"):
        store.get_bytes(KEY)
    with pytest.raises(EvidenceStoreError, match="symbolic link"):
        b"".join(store.read_chunks(KEY))
    result = store.flush()

    assert KEY in " ".join(result.pending) and "symbolic link" in (result.error or store.last_error)
    assert all(HOST not in body for body in s3.objects(store.bucket.bucket).values())


def test_a_fifo_in_place_of_spooled_data_or_of_a_record_holds_nothing_up(spooled, s3) -> None:
    store, data, _ = spooled
    data.unlink()
    os.mkfifo(data)  # nobody will ever write it
    os.mkfifo(data.with_name("000000000999.json"))

    with pytest.raises(EvidenceStoreError, match="FIFO"):
        within(20, lambda: store.get_bytes(KEY), "a read of a FIFO in the spool to give up")
    assert len(within(20, store.spool.pending, "the spool's records to be listed past a FIFO")) == 1
    s3.proxy.reset()
    result = within(60, store.flush, "a flush past a FIFO in the spool")
    assert KEY in " ".join(result.pending)


@pytest.mark.parametrize("lock", ["lock", "upload.lock"])
def test_a_fifo_or_a_link_in_place_of_a_spool_lock_holds_no_write_up(make_store, s3, tmp_path: Path, lock) -> None:
    store = make_store()
    s3.proxy.fail(_puts, 403, "AccessDenied")
    store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"tail\n")
    planted = store.spool.root / lock
    planted.unlink()
    os.mkfifo(planted)

    with pytest.raises(EvidenceStoreError, match="lock"):
        within(20, lambda: (store.put_bytes(KEY, b"step 2\n"), store.flush()), "a write past a FIFO lock")
    host = tmp_path / "host-file"
    host.write_bytes(HOST)
    planted.unlink()
    planted.symlink_to(host)
    with pytest.raises(EvidenceStoreError, match="lock"):
        within(20, lambda: (store.put_bytes(KEY, b"step 3\n"), store.flush()), "a write past a linked lock")
    assert host.read_bytes() == HOST
