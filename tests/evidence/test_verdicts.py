"""Keeping a verdict beside its evidence and reading it back: one module, whoever judged the attempt."""

from __future__ import annotations

import json
import sys
import threading
import traceback
from pathlib import Path

import pytest

from trainguard.core.attempt import AttemptSummary
from trainguard.core.evidence import verdicts
from trainguard.core.evidence.manifest import Manifest, read_manifest, store_manifest
from trainguard.core.policy import RetryDecision
from trainguard.core.stores.folder import LocalEvidenceStore
from waiting import wait_for


@pytest.fixture
def store(tmp_path: Path) -> LocalEvidenceStore:
    return LocalEvidenceStore(tmp_path / "evidence")


def _judged(attempt: int = 1) -> AttemptSummary:
    return AttemptSummary("r1", attempt, 3, "Failed", category="code_error", rule_id="python.traceback",
                          decision=RetryDecision(retry=False, reason="a code error is not retried"))


def _plain(summary: AttemptSummary | None) -> object:
    assert summary is not None
    return json.loads(json.dumps(summary.to_dict()))


def test_a_kept_verdict_is_listed_in_the_manifest_indexed_and_read_back_as_it_was_kept(store) -> None:
    manifest = store_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (), ()), "flow")

    kept = verdicts.keep(store, _judged(), "retry-controller", manifest=manifest, items={"extra.json": b"{}"})

    assert kept.warnings == () and kept.summary.storage_problems == ()
    listed = {item.name: item.source for item in read_manifest(store, "r1", 1).items}
    assert listed == {"verdict.json": "retry-controller", "extra.json": "retry-controller"}
    assert kept.manifest is not None and {i.name for i in kept.manifest.items} == set(listed)
    assert json.loads(store.get_bytes(kept.index_key))["category"] == "code_error"
    assert _plain(verdicts.read(store, "r1", 1)) == _plain(_judged())  # what keeping found is the caller's to say
    assert "verdict.json" in kept.summary.evidence_links  # the upload status the report shows


def test_without_a_manifest_the_verdict_is_still_kept_and_says_it_is_not_listed(store) -> None:
    kept = verdicts.keep(store, _judged(2), "cli")

    assert kept.manifest is None
    assert kept.summary.storage_problems[0].startswith("verdict.json was stored but is not listed in the manifest")
    assert _plain(verdicts.read(store, "r1", 2)) == _plain(_judged(2))


def test_reading_back_what_is_not_a_verdict_gives_none_never_raises(store) -> None:
    assert verdicts.read(store, "r1", 3) is None
    for junk in (b"[1, 2]", b"\xff\xfe not json", b"[" * 100_000):
        store.put_bytes("runs/r1/attempt-3/verdict.json", junk)
        assert verdicts.read(store, "r1", 3) is None


def test_after_last_word_another_thread_keeps_no_verdict_over_the_one_that_ended_the_run(store) -> None:
    """`trainguard run` stopping from a side thread: the flow in the main thread must not overwrite its verdict."""
    stop = AttemptSummary("r1", 1, 3, "Cancelled", category="user_cancelled", rule_id="cli.sigterm",
                          decision=RetryDecision(retry=False, reason="stopped"))
    spoken, release = threading.Event(), threading.Event()

    def stopper() -> None:
        verdicts.last_word()
        try:
            verdicts.keep(store, stop, "cli")
            spoken.set()
            release.wait(30)
        finally:  # a real stop ends the process here; the test gives the lock back instead
            verdicts._KEEPING.release()

    side = threading.Thread(target=stopper)
    side.start()
    wait_for(spoken.is_set, 10, "the stop's verdict")
    flow = threading.Thread(target=verdicts.keep, args=(store, _judged(), "flow"))
    flow.start()
    # the moment the flow's verdict would have been written: its thread waiting inside `keep`
    wait_for(lambda: "_KEEPING" in "".join(traceback.format_stack(sys._current_frames()[flow.ident])), 10,
             "the flow's keep to wait for the lock")
    assert verdicts.read(store, "r1", 1).state == "Cancelled"
    release.set()
    side.join(10)
    flow.join(10)
