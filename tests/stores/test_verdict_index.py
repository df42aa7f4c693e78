"""The verdict index on the folder store and on S3 (moto on loopback): written per attempt by concurrent
writers, compacted once a day is closed without losing a record, and never failing an attempt."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trainguard.core.attempt import AttemptSummary
from trainguard.core.evidence import index
from trainguard.core.fleet.analysis import Tally
from trainguard.core.policy import RetryDecision
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.stores.folder import LocalEvidenceStore

DAY = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
LATER = DAY + timedelta(days=2)  # the day is closed by then


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path: Path) -> EvidenceStore:
    if request.param == "folder":
        return LocalEvidenceStore(tmp_path / "evidence")
    return request.getfixturevalue("make_store")()


def summary(run: str, attempt: int = 1, node: str = "gpu-01", **changes) -> AttemptSummary:
    fields = dict(run_id=run, attempt=attempt, max_attempts=3, state="Failed", category="gpu_fault",
                  rule_id="xid-79", fingerprint="f" * 16, signature="NVRM: Xid 79, GPU has fallen off the bus",
                  node=node, gpus=8, duration_seconds=3600.0, decision=RetryDecision(retry=True, reason="-"))
    return AttemptSummary(**{**fields, **changes})


def read_all(store: EvidenceStore, now: datetime = LATER) -> tuple[index.IndexReader, list[dict]]:
    reader = index.IndexReader(store, now=now)
    return reader, list(reader.records(DAY - timedelta(days=1), now))


def test_one_small_object_per_attempt_under_its_day_with_the_compact_record(store) -> None:
    key, problem = index.keep(store, summary("r1"), DAY)

    assert problem is None and key == "index/verdicts/2026-11-03/r1.a1.json"
    assert store.list_keys("index/") == [key]
    record = json.loads(store.get_bytes(key))
    assert record == {"v": 1, "run": "r1", "attempt": 1, "ended_at": "2026-11-03T10:00:00Z", "state": "Failed",
                      "category": "gpu_fault", "rule": "xid-79", "fingerprint": "f" * 16,
                      "signature": "NVRM: Xid 79, GPU has fallen off the bus", "node": "gpu-01",
                      "nodes": ["gpu-01"], "gpu_seconds": 28800.0, "wasted_gpu_seconds": 28800.0, "retried": True,
                      "avoid": []}


def test_the_culprits_node_is_where_a_multi_node_failure_is_placed(store) -> None:
    multi = summary("r1", node="gpu-02", root_cause={"index": 1, "node": "gpu-02", "rank": 9},
                    victims=({"index": 0, "node": "gpu-01", "rank": 0},))
    index.keep(store, multi, DAY)

    (record,) = read_all(store, DAY + timedelta(minutes=1))[1]
    assert record["node"] == "gpu-02" and record["nodes"] == ["gpu-01", "gpu-02"]


def test_rewriting_an_attempts_verdict_keeps_one_record_the_newest(store) -> None:
    index.keep(store, summary("r1"), DAY)
    index.keep(store, summary("r1", decision=RetryDecision(retry=False, reason="stopped")), DAY + timedelta(seconds=5))

    records = read_all(store, DAY + timedelta(minutes=1))[1]
    assert [(r["run"], r["retried"]) for r in records] == [("r1", False)]


def test_a_verdict_rewritten_after_midnight_is_one_record_the_newest_across_the_window(store) -> None:
    """The retry controller settles an attempt at 00:00:10 whose flow judged it at 23:59:50: a record on each day."""
    before_midnight = datetime(2026, 11, 3, 23, 59, 50, tzinfo=UTC)
    index.keep(store, summary("r1", category="nccl_error"), before_midnight)
    index.keep(store, summary("r2"), before_midnight)
    index.keep(store, summary("r1", decision=RetryDecision(retry=False, reason="stopped"), category="gpu_fault"),
               before_midnight + timedelta(seconds=20))
    assert len(store.list_keys("index/verdicts/")) == 3  # two days hold r1's attempt 1

    for now in (DAY + timedelta(days=1, hours=12), LATER):  # the first day open, then both compacted
        reader, records = read_all(store, now)
        assert sorted((r["run"], r["ended_at"], r["retried"]) for r in records) == [
            ("r1", "2026-11-04T00:00:10Z", False), ("r2", "2026-11-03T23:59:50Z", True)], now
        assert Tally().add_all(records).view().attempts == 2

    window_before_the_rewrite = list(index.IndexReader(store, now=LATER).records(DAY, before_midnight))
    assert sorted((r["run"], r["category"]) for r in window_before_the_rewrite) == [("r1", "nccl_error"),
                                                                                     ("r2", "gpu_fault")]


def test_concurrent_writers_and_compactors_lose_no_record(store) -> None:
    """Writers keep writing into a closed day (late verdicts, skewed clocks) while two readers compact it."""
    for n in range(10):
        index.keep(store, summary(f"early-{n}"), DAY)
    writing = [threading.Thread(target=lambda n=n: index.keep(store, summary(f"late-{n}"), DAY))
               for n in range(20)]
    compacting = [threading.Thread(target=read_all, args=(store,)) for _ in range(2)]
    for thread in [*writing, *compacting]:
        thread.start()
    for thread in [*writing, *compacting]:
        thread.join()

    reader, records = read_all(store)  # the third reader merges whatever parts the race left

    assert sorted(r["run"] for r in records) == sorted([f"early-{n}" for n in range(10)] +
                                                       [f"late-{n}" for n in range(20)])
    assert reader.problems == []
    keys = store.list_keys("index/verdicts/2026-11-03/")
    assert len(keys) == 1 and keys[0].endswith(".jsonl"), keys
    def by_run(found: list[dict]) -> list[dict]:
        return sorted(found, key=lambda r: r["run"])

    assert by_run(read_all(store)[1]) == by_run(records)  # the same records again, in whatever order the parts hold them


def test_an_open_day_is_not_compacted(store) -> None:
    index.keep(store, summary("r1"), DAY)
    index.keep(store, summary("r2"), DAY)

    _, records = read_all(store, DAY + timedelta(hours=14, minutes=30))  # 00:30 the next day: not closed yet

    assert len(records) == 2
    assert store.list_keys("index/") == ["index/verdicts/2026-11-03/r1.a1.json", "index/verdicts/2026-11-03/r2.a1.json"]


def test_the_window_keeps_only_records_inside_it(store) -> None:
    index.keep(store, summary("old"), DAY - timedelta(days=10))
    index.keep(store, summary("new"), DAY)

    reader = index.IndexReader(store, now=LATER)
    assert [r["run"] for r in reader.records(DAY - timedelta(hours=1))] == ["new"]


def test_a_hostile_line_is_masked_flattened_and_bounded_in_the_index(store, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "sekr1t-value-9d2c")
    line = "\x1b[31mboom\x1b[0m HF_TOKEN=sekr1t-value-9d2c\nsecond line " + "x" * 5000
    index.keep(store, summary("r1", signature=line, node="gpu-\x1b]0;pwned\x07-01"), DAY)

    (record,) = read_all(store, DAY + timedelta(minutes=1))[1]
    assert "sekr1t" not in json.dumps(record) and "\x1b" not in json.dumps(record)
    assert len(record["signature"]) <= index.SIGNATURE_LIMIT and "\n" not in record["signature"]


def test_garbage_in_the_index_is_skipped_and_counted(store) -> None:
    index.keep(store, summary("r1"), DAY)
    store.put_bytes("index/verdicts/2026-11-03/junk.json", b"\xff\xfe not json")
    store.put_bytes("index/verdicts/2026-11-03/list.json", b"[1, 2]")

    reader, records = read_all(store, DAY + timedelta(minutes=1))

    assert [r["run"] for r in records] == ["r1"] and reader.skipped == 2


def test_a_damaged_line_in_a_compacted_part_costs_only_itself(store) -> None:
    good = [json.dumps(index.entry(summary(f"r{n}"), DAY + timedelta(minutes=n))) for n in range(3)]
    body = f"{good[0]}\n".encode() + b"\xff\xfe{not utf-8}\n\n" + f"  {good[1]}\r\n{good[2]}\n".encode()
    store.put_bytes("index/verdicts/2026-11-03/compacted-0123456789abcdef.jsonl", body)

    reader, records = read_all(store)

    assert [r["run"] for r in records] == ["r2", "r1", "r0"] and reader.skipped == 1  # newest first


def test_a_folder_that_cannot_take_the_record_is_reported_not_raised(tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "index").write_bytes(b"a file where the index folder would be")

    key, problem = index.keep(store, summary("r1"), DAY)

    assert problem is not None and problem.startswith(f"verdict index {key} could not be written: ")
    assert "\n" not in problem


def test_a_record_s3_refuses_waits_in_the_spool_and_goes_up_with_a_flush(make_store, s3) -> None:
    store = make_store()
    s3.proxy.fail(lambda method, path: method == "PUT" and "/index/" in path, 403, "AccessDenied")

    key, problem = index.keep(store, summary("r1"), DAY)

    assert problem is None and store.pending() == [key]
    s3.proxy.reset()
    assert store.flush().pending == ()
    assert f"tg/{key}" in s3.objects(store.bucket.bucket)
