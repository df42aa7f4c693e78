"""`trainguard evidence show | get | list | flush | retention apply | prune` on both kinds of store.

The S3 side is moto on loopback behind the fault proxy; the S3 block is saved on the session's real
Prefect server and loaded by reference, as a user's command would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.core.evidence.manifest import Manifest, ManifestItem, write_manifest
from trainguard.core.stores.folder import LocalEvidenceStore

from blocks.evidence import S3EvidenceStore

runner = CliRunner()
LOG = b"step 1\n" * 300_000  # 2 MiB: more than one 1 MiB read


def _bundle(store, run_id: str, attempt: int, state: str | None, created: datetime | None = None) -> None:
    """An attempt's bundle: its log and, unless ``state`` is None (never judged), its verdict."""
    items = []
    verdict = {"run_id": run_id, "attempt": attempt, "max_attempts": 3, "state": state,
               "category": None if state == "Completed" else "cuda_oom"}
    for name, data in (("logs/train.log", LOG), ("verdict.json", json.dumps(verdict).encode()))[:2 if state else 1]:
        stored = store.put_bytes(f"runs/{run_id}/attempt-{attempt}/{name}", data)
        items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, "test",
                                  "2026-01-01T00:00:00+00:00", stored.checksum_sha256))
    stamp = (created or datetime.now(UTC)).isoformat()
    write_manifest(store, Manifest(run_id, attempt, stamp, tuple(items), ()))


@pytest.fixture
def s3_block(prefect_server, s3, tmp_path):
    block = S3EvidenceStore(bucket=s3.new_bucket(), prefix="ev", region="us-east-1", endpoint_url=s3.proxy.url,
                            spool_dir=str(tmp_path / "spool"), retry_attempts=2, retry_base_delay_seconds=0.01)
    name = f"s3-{uuid.uuid4().hex[:8]}"
    block.save(name)
    return f"trainguard-s3-evidence-store/{name}", block


def test_show_verifies_s3_objects_by_their_stored_checksums_without_downloading_them(s3_block, s3) -> None:
    reference, block = s3_block
    _bundle(block.store(), "r1", 1, "Failed")
    s3.proxy.requests.clear()

    shown = runner.invoke(app, ["evidence", "show", "r1", "--block", reference])

    assert shown.exit_code == 0, shown.output
    assert "logs/train.log" in shown.output and "ok" in shown.output
    assert not [p for m, p in s3.proxy.requests if m == "GET" and p.endswith("logs/train.log")]
    assert [p for m, p in s3.proxy.requests if m == "HEAD" and p.endswith("logs/train.log")]

    deep = runner.invoke(app, ["evidence", "show", "r1", "--block", reference, "--deep"])
    assert deep.exit_code == 0 and [p for m, p in s3.proxy.requests if m == "GET" and p.endswith("logs/train.log")]


def test_show_reports_an_object_changed_in_the_bucket(s3_block, s3) -> None:
    reference, block = s3_block
    _bundle(block.store(), "r1", 1, "Failed")
    changed = LOG.replace(b"step 1", b"step 2")
    s3.client().put_object(Bucket=block.bucket, Key="ev/runs/r1/attempt-1/logs/train.log", Body=changed,
                           ChecksumAlgorithm="SHA256",
                           ChecksumSHA256=base64.b64encode(hashlib.sha256(changed).digest()).decode())
    s3.proxy.requests.clear()

    shown = runner.invoke(app, ["evidence", "show", "r1", "--block", reference])

    assert shown.exit_code == 1
    assert "FAILED" in shown.output and "logs/train.log: stored checksum is" in shown.output
    assert not [p for m, p in s3.proxy.requests if m == "GET" and p.endswith("logs/train.log")]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_get_streams_an_item_to_a_file_and_checks_its_sha256(kind, s3_block, tmp_path) -> None:
    reference, block = s3_block
    store, where = (block.store(), ["--block", reference]) if kind == "s3" else (
        LocalEvidenceStore(tmp_path / "ev"), ["--root", str(tmp_path / "ev")])
    _bundle(store, "r1", 1, "Failed")
    target = tmp_path / "out" / "train.log"
    target.parent.mkdir()

    got = runner.invoke(app, ["evidence", "get", "r1", "1", "logs/train.log", "-o", str(target), *where])

    assert got.exit_code == 0, got.output
    assert target.read_bytes() == LOG and "sha256 verified" in got.output
    assert sorted(p.name for p in target.parent.iterdir()) == ["train.log"]  # no partial file left

    missing = runner.invoke(app, ["evidence", "get", "r1", "1", "nope.txt", *where])
    assert missing.exit_code == 2 and "not in the manifest" in missing.output and "logs/train.log" in missing.output


ODD = "coredumps/\x1b[31mred\u202eexe.core"  # a file name with a terminal escape and a bidi override
ODD_KEY_NAME = "coredumps/%1B[31mred%E2%80%AEexe.core"  # as the collectors spell it


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_an_item_kept_under_a_printable_name_is_got_by_the_jobs_name_and_shown_under_both(kind, s3_block,
                                                                                        tmp_path) -> None:
    reference, block = s3_block
    store, where = (block.store(), ["--block", reference]) if kind == "s3" else (
        LocalEvidenceStore(tmp_path / "ev"), ["--root", str(tmp_path / "ev")])
    stored = store.put_bytes(f"runs/r1/attempt-1/{ODD_KEY_NAME}", b"a small core")
    item = ManifestItem(ODD_KEY_NAME, stored.key, stored.sha256, stored.size_bytes, "entrypoint",
                        "2026-01-01T00:00:00+00:00", stored.checksum_sha256, ODD)
    write_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (item,), ()))
    target = tmp_path / "out"
    target.mkdir()

    got = runner.invoke(app, ["evidence", "get", "r1", "1", ODD, "-o", str(target / "core"), *where])
    shown = runner.invoke(app, ["evidence", "show", "r1", *where])

    assert got.exit_code == 0, got.output
    assert (target / "core").read_bytes() == b"a small core"
    assert shown.exit_code == 0, shown.output
    assert "%1B[31mred%E2%80%AEexe.core" in shown.output
    assert "\\x1b[31mred\\u202eexe.core" in shown.output  # the job's name, its escapes spelled out
    assert "\x1b" not in shown.output and "\u202e" not in shown.output and "\x1b" not in got.output


def test_list_shows_recent_runs_with_their_verdicts(s3_block) -> None:
    reference, block = s3_block
    store = block.store()
    _bundle(store, "old-run", 1, "Completed", datetime.now(UTC) - timedelta(days=2))
    _bundle(store, "new-run", 1, "Failed")
    _bundle(store, "new-run", 2, "Failed")

    listed = runner.invoke(app, ["evidence", "list", "--block", reference])

    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    new, old = (next(i for i, line in enumerate(lines) if name in line) for name in ("new-run", "old-run"))
    assert new < old and "failed" in lines[new] and "cuda_oom" in lines[new] and "succeeded" in lines[old]


def test_runs_lists_an_s3_stores_runs_with_their_verdict_and_last_change(s3_block, tmp_path) -> None:
    reference, block = s3_block
    created = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    _bundle(block.store(), "s3-run", 1, "Failed", created)

    listed = runner.invoke(app, ["runs", "--block", reference, "--work", str(tmp_path / "no-work")])

    assert listed.exit_code == 0, listed.output
    line = next(line for line in listed.output.splitlines() if "s3-run" in line)
    assert "Failed" in line and "cuda_oom" in line
    assert created.astimezone().strftime("%Y-%m-%d %H:%M:%S") in line  # read from the manifest: no folder to stat


def test_retention_apply_puts_lifecycle_rules_that_read_back(s3_block, s3) -> None:
    reference, block = s3_block
    s3.client().put_bucket_lifecycle_configuration(Bucket=block.bucket, LifecycleConfiguration={"Rules": [
        {"ID": "someone-elses", "Status": "Enabled", "Filter": {"Prefix": "other/"}, "Expiration": {"Days": 90}}]})

    applied = runner.invoke(app, ["evidence", "retention", "apply", "--block", reference])

    assert applied.exit_code == 0, applied.output
    rules = {r["ID"]: r for r in s3.client().get_bucket_lifecycle_configuration(Bucket=block.bucket)["Rules"]}
    assert rules["someone-elses"]["Expiration"] == {"Days": 90}  # left alone
    failed, succeeded = rules["trainguard-failed:ev/"], rules["trainguard-succeeded:ev/"]
    assert failed["Expiration"] == {"Days": 30} and succeeded["Expiration"] == {"Days": 7}
    assert failed["Filter"]["And"]["Prefix"] == "ev/runs/"
    assert failed["Filter"]["And"]["Tags"] == [{"Key": "trainguard-outcome", "Value": "failed"}]
    assert rules["trainguard-incomplete-uploads:ev/"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}

    too_short = runner.invoke(app, ["evidence", "retention", "apply", "--block", reference, "--succeeded-days", "3"])
    assert too_short.exit_code == 2 and "--succeeded-days=3" in too_short.output and "at least 7 days" in too_short.output


def test_flush_uploads_what_s3_refused_and_a_403_is_one_clear_line_with_the_spool_kept(s3_block, s3) -> None:
    reference, block = s3_block
    s3.proxy.fail(lambda method, path: method == "PUT" and "/runs/" in path, 403, "AccessDenied")
    _bundle(block.store(), "r1", 1, "Failed")

    refused = runner.invoke(app, ["evidence", "flush", "--block", reference])

    assert refused.exit_code == 1
    assert "access denied" in refused.output and "spool" in refused.output and "Traceback" not in refused.output
    shown = runner.invoke(app, ["evidence", "show", "r1", "--block", reference])
    assert shown.exit_code == 0 and shown.output.count("spooled, not uploaded yet") == 2  # readable meanwhile
    s3.proxy.reset()
    flushed = runner.invoke(app, ["evidence", "flush", "--block", reference])
    assert flushed.exit_code == 0 and "uploaded 3, still spooled 0" in flushed.output
    assert len(s3.objects(block.bucket)) == 3


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_prune_deletes_expired_attempts_but_never_a_runs_newest_failure(kind, s3_block, tmp_path) -> None:
    reference, block = s3_block
    store, where = (block.store(), ["--block", reference]) if kind == "s3" else (
        LocalEvidenceStore(tmp_path / "ev"), ["--root", str(tmp_path / "ev")])
    long_ago = datetime.now(UTC) - timedelta(days=60)
    _bundle(store, "r1", 1, "Failed", long_ago)
    _bundle(store, "r1", 2, "Failed", long_ago)
    _bundle(store, "r1", 3, "Completed", long_ago)
    _bundle(store, "r1", 4, None, long_ago)  # never judged (a lost attempt): not the run's newest failure
    _bundle(store, "r2", 1, "Completed", datetime.now(UTC) - timedelta(days=3))
    _bundle(store, "r3", 1, None, long_ago)  # a run never judged at all keeps its newest attempt

    dry = runner.invoke(app, ["evidence", "prune", *where, "--dry-run"])
    assert dry.exit_code == 0 and "3 of 6 attempt(s) would be deleted" in dry.output, dry.output
    assert len(store.list_keys("runs/")) == 16

    pruned = runner.invoke(app, ["evidence", "prune", *where])

    assert pruned.exit_code == 0, pruned.output
    assert "r1 attempt 2: kept (the run's newest failure" in pruned.output
    remaining = {"/".join(key.split("/")[:3]) for key in store.list_keys("runs/")}
    assert remaining == {"runs/r1/attempt-2", "runs/r2/attempt-1", "runs/r3/attempt-1"}


@pytest.mark.parametrize(("field", "value"), [("size_bytes", "12"), ("size_bytes", True), ("sha256", 5),
                                              ("name", None)])
def test_show_of_a_manifest_with_a_mistyped_field_is_one_line_naming_it(tmp_path, field: str, value: object) -> None:
    store = LocalEvidenceStore(tmp_path / "ev")
    _bundle(store, "r1", 1, "Failed")
    path = tmp_path / "ev" / "runs" / "r1" / "attempt-1" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["items"][0][field] = value
    path.write_text(json.dumps(doc))

    shown = runner.invoke(app, ["evidence", "show", "r1", "--root", str(tmp_path / "ev")])

    assert shown.exit_code == 1 and isinstance(shown.exception, SystemExit), shown.output  # not a ValueError
    first = shown.output.splitlines()[0]
    assert "manifest.json is unreadable" in first and f"'{field}' must be" in first, shown.output
    assert "Traceback" not in shown.output and "error: 1 evidence problem(s)" in shown.output
