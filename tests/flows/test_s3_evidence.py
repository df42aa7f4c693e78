"""Attempts whose evidence block is an S3 store: real flows, boto3 against moto on loopback.

The S3 side is moto in server mode behind the fault proxy (tests/s3fixtures.py); nothing of boto3
is patched. When the proxy goes down mid-collection it is S3 dying mid-upload, as clients see it.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
import uuid

import yaml

from prefect.artifacts import Artifact
from typer.testing import CliRunner

from flow_helpers import prefect_records, run, tiny_spec
from s3fixtures import CREDENTIALS
from waiting import wait_for

from blocks.evidence import S3EvidenceStore
from trainguard.cli import app
from trainguard.core.evidence import bundles
from trainguard.core.stores.s3 import bucket as s3_client
from trainguard.core.evidence.manifest import read_manifest
from trainguard.core.evidence.retention import OUTCOME_TAG

SECRET = "planted-secret-4242"
SESSION_TOKEN = "planted-session-token-FwoGZXIvYXdzE"


def _s3_block(s3, tmp_path, **fields) -> tuple[str, S3EvidenceStore]:
    fields = {"retry_attempts": 2, "retry_base_delay_seconds": 0.01, "upload_budget_seconds": 60, **fields}
    block = S3EvidenceStore(
        bucket=s3.new_bucket(), prefix="evidence", region="us-east-1", endpoint_url=s3.proxy.url,
        spool_dir=str(tmp_path / "spool"), **fields,
    )
    name = f"s3-{uuid.uuid4().hex[:8]}"
    block.save(name)
    return f"trainguard-s3-evidence-store/{name}", block


def _run_one_failing_attempt(blocks, evidence_block: str, run_id: str, max_attempts: int = 1):
    os.environ["TG_TEST_WANDB_API_KEY"] = SECRET  # where a worker holds it; the spec only names it
    spec = tiny_spec(run_id, "--fail-at-step", "35", "--fail-on-attempt", "1",
                     secret_env={"WANDB_API_KEY": "env:TG_TEST_WANDB_API_KEY"}, retry={"max_total_attempts": max_attempts})
    return run(spec, blocks, run_id, evidence_block=evidence_block)


def test_an_attempts_bundle_round_trips_through_s3_with_checksums_links_and_no_secrets(
    blocks, s3, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)  # temporary credentials, as under STS or IRSA
    # The store's boto3 session resolves the credential chain once per process, as a worker's does; an
    # earlier test in this process resolved it without a session token, so this one starts a fresh session.
    monkeypatch.setattr(s3_client, "_SESSION", None)
    monkeypatch.setenv("TG_TEST_WANDB_API_KEY", SECRET)  # where a worker holds it; the spec only names it
    reference, block = _s3_block(s3, tmp_path)
    spec = tiny_spec("s3-round-trip", "--fail-at-step", "35", secret_env={"WANDB_API_KEY": "env:TG_TEST_WANDB_API_KEY"},
                     retry={"max_total_attempts": 1})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))

    ran = CliRunner().invoke(app, ["run", str(tmp_path / "run.yaml"), "--backend", blocks["backend_block"],
                                   "--evidence", reference])

    assert ran.exit_code == 1, ran.output  # the attempt failed, as the spec says
    shown = re.search(rf"evidence: s3://{block.bucket}/evidence/runs/(s3-round-trip-[0-9a-f]{{8}}) ", ran.output)
    assert shown, ran.output  # the run's evidence as an s3:// URI, not folded into s3:/ by Path()
    run_id = shown.group(1)
    store = block.store()
    manifest = read_manifest(store, run_id, 1)
    names = {item.name for item in manifest.items}
    assert {"crash-report.json", "crash-tail.txt", "snapshot/env.json", "verdict.json"} <= names
    assert all(item.checksum_sha256 for item in manifest.items)
    assert bundles.verify(store, manifest) == {} and bundles.verify(store, manifest, deep=True) == {}
    stored = s3.objects(block.bucket)
    assert set(stored) - set(index_records(stored)) == {f"evidence/{item.key}" for item in manifest.items} | {
        f"evidence/runs/{run_id}/attempt-1/manifest.json"}
    assert [key.rpartition("/")[2] for key in index_records(stored)] == [f"{run_id}.a1.json"]  # the fleet's record
    for key, data in stored.items():
        assert SECRET.encode() not in data and CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() not in data, key
        assert SESSION_TOKEN.encode() not in data, key
    tags = s3.client().get_object_tagging(Bucket=block.bucket, Key=f"evidence/runs/{run_id}/attempt-1/crash-tail.txt")
    assert {"Key": OUTCOME_TAG, "Value": "failed"} in tags["TagSet"]
    assert store.pending() == [] and not list((tmp_path / "spool").rglob("*.data"))

    _assert_links_work_and_are_shown_in_the_report_only(run_id, stored)


def _assert_links_work_and_are_shown_in_the_report_only(run_id: str, stored: dict[str, bytes]) -> None:
    report = Artifact.get(f"{run_id}-attempt-1").data
    assert "links expire" in report
    link = re.search(r"\[crash-tail\.txt\]\(<([^>]+)>\)", report).group(1)
    assert "X-Amz-Expires=" in link and "X-Amz-Signature=" in link
    assert f"X-Amz-Security-Token={SESSION_TOKEN}" in link
    with urllib.request.urlopen(link, timeout=10) as answer:  # no credentials: the signature is the access
        assert answer.read() == stored[f"evidence/runs/{run_id}/attempt-1/crash-tail.txt"]
    # nothing stored holds a link or the session token in it
    artifacts, parameters, logs = prefect_records(run_id)
    shown_only = re.sub(r"\(<https?://[^>]+>\)", "(link)", report)
    for text in [shown_only, *(a for a in artifacts if a != report), *parameters, *logs]:
        assert SESSION_TOKEN not in text and "X-Amz-Signature" not in text, text[:300]
    verdict = json.loads(stored[f"evidence/runs/{run_id}/attempt-1/verdict.json"])
    assert verdict["category"] == "nccl_error" and "evidence_links" not in verdict


def test_a_hanging_s3_holds_up_neither_the_verdicts_nor_the_next_attempt_and_the_uploads_finish_once_it_answers(
    blocks, s3, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    # the default budget: an attempt that waited on S3 would wait out ten minutes here
    reference, block = _s3_block(s3, tmp_path, upload_budget_seconds=600)
    s3.proxy.hold(lambda method, path: True, every=True)  # S3 answers nothing, from the start
    ended: list = []
    runner = threading.Thread(target=lambda: ended.append(_run_one_failing_attempt(blocks, reference, "s3-hang", 2)))
    runner.start()
    try:
        # both attempts are judged and reported, the second one started after the first's verdict, while
        # S3 has answered no request at all
        wait_for(lambda: _artifact("s3-hang-attempt-2"), timeout=120, what="attempt 2 judged and reported")
        assert s3.proxy.holding >= 1 and s3.objects(block.bucket) == {} and not ended
        first = _artifact("s3-hang-attempt-1")
        assert "nccl\\_error" in first and "go up to the object store after the verdict" in first
        assert "(uploading)" in first and "(spooled, not uploaded yet)" not in first
    finally:
        s3.proxy.reset()  # S3 answers again: the held requests go through
        runner.join(timeout=120)
    state, history = ended[0]
    assert state.is_completed() and [h["state"] for h in history] == ["Failed", "Completed"]
    assert [list(h["evidence_spooled"]) for h in history] == [[], []]  # the run waited for its uploads at its end
    assert block.store().pending() == []
    for attempt in (1, 2):
        manifest = read_manifest(block.store(), "s3-hang", attempt)
        assert bundles.verify(block.store(), manifest, deep=True) == {}
        report = _artifact(f"s3-hang-attempt-{attempt}")  # published again once its evidence was up
        assert "uploading" not in report and "[manifest.json]" not in report and "[verdict.json](<" in report


def _artifact(key: str) -> str | None:
    found = Artifact.get(key)
    return str(found.data) if found is not None else None


def test_s3_dying_mid_upload_then_hanging_leaves_both_attempts_spooled_and_flush_completes_them(
    blocks, s3, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    # the production retry settings (5 tries, 0.5 s first backoff, 60 s read timeout); a budget a test can wait out
    reference, block = _s3_block(s3, tmp_path, retry_attempts=5, retry_base_delay_seconds=0.5, upload_budget_seconds=1)
    # S3 dies as the first item goes up (that request is dropped unanswered), then its endpoint answers nothing
    s3.proxy.down_on(lambda method, path: method in ("PUT", "POST"), then_hang=True)

    state, history = _run_one_failing_attempt(blocks, reference, "s3-outage", max_attempts=2)

    assert s3.proxy.holding == s3.proxy.held_total >= 1  # S3 answered none of them: the run went on without it
    assert state.is_completed() and [h["state"] for h in history] == ["Failed", "Completed"]
    assert history[0]["category"] == "nccl_error" and "Watchdog" in history[0]["signature"]
    assert history[0]["decision"]["retry"]
    spooled = history[0]["evidence_spooled"]  # as the verdict step left it: it never waits long on S3, nor fails
    assert {"manifest.json", "verdict.json", f"(tags {OUTCOME_TAG}=failed)"} <= set(spooled)
    assert any(name.startswith("snapshot/") for name in spooled)
    for attempt in history:
        assert {"manifest.json", "verdict.json"} <= set(attempt["evidence_spooled"])
    # attempt 1: its retry waited out the budget, or no retry fitted in it; attempt 2 waited on its run's backlog
    assert "budget" in history[0]["evidence_upload_error"]
    assert "upload time budget (1 s) is spent" in history[1]["evidence_upload_error"]
    report = Artifact.get("s3-outage-attempt-1").data
    assert f"{len(spooled)} items wait in the local spool" in report and "trainguard evidence flush" in report
    assert "verdict.json (spooled, not uploaded yet)" in report
    assert not any(key.endswith("manifest.json") for key in s3.objects(block.bucket))  # never claims completeness
    for spool_file in (tmp_path / "spool").rglob("*"):
        assert not spool_file.is_file() or SESSION_TOKEN.encode() not in spool_file.read_bytes(), spool_file

    s3.proxy.reset()
    wait_for(lambda: s3.proxy.holding == 0, what="the held requests to end")
    result = block.store(no_time_limit=True).flush()

    assert result.pending == () and result.error == ""
    _assert_both_bundles_complete_and_tagged(block, s3)


def index_records(stored: dict[str, bytes]) -> list[str]:
    """The verdict index's records among the bucket's keys (one per judged attempt, beside the bundles)."""
    return sorted(key for key in stored if key.startswith("evidence/index/verdicts/"))


def _assert_both_bundles_complete_and_tagged(block: S3EvidenceStore, s3) -> None:
    store, expected = block.store(), set()
    for attempt in (1, 2):
        manifest = read_manifest(store, "s3-outage", attempt)
        assert "verdict.json" in {item.name for item in manifest.items}  # recorded while S3 was away
        assert bundles.verify(store, manifest, deep=True) == {}
        expected |= {f"evidence/{item.key}" for item in manifest.items}
        expected.add(f"evidence/runs/s3-outage/attempt-{attempt}/manifest.json")
    stored = s3.objects(block.bucket)
    assert sorted(set(stored) - set(index_records(stored))) == sorted(expected)  # nothing duplicated or lost
    assert sorted(key.rpartition("/")[2] for key in index_records(stored)) == ["s3-outage.a1.json", "s3-outage.a2.json"]
    wait_for(lambda: s3.client().list_multipart_uploads(Bucket=block.bucket).get("Uploads", []) == [],
             what="no multipart upload left behind")
    for key in set(stored) - set(index_records(stored)):  # uploaded before the outage or spooled during it: all
        # of a bundle carry their attempt's outcome (the index's records are the fleet's, kept apart from bundles)
        outcome = "failed" if "/attempt-1/" in key else "succeeded"
        assert s3.client().get_object_tagging(Bucket=block.bucket, Key=key)["TagSet"] == [
            {"Key": OUTCOME_TAG, "Value": outcome}], key
