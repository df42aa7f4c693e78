"""The manifest: written last, read back, verified, and kept when the disk is full."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core.evidence.manifest import (
    add_items,
    Manifest,
    ManifestError,
    ManifestItem,
    MissingItem,
    attempt_prefix,
    read_manifest,
    release_space,
    reserve_space,
    storage_failures,
    store_manifest,
    verify_manifest,
    write_manifest,
)
from trainguard.core.attempt import AttemptSummary
from trainguard.core.evidence import verdicts
from trainguard.core.stores.base import EvidenceStoreError
from trainguard.core.stores.folder import LocalEvidenceStore


@pytest.fixture
def store(tmp_path: Path) -> LocalEvidenceStore:
    return LocalEvidenceStore(tmp_path / "evidence")


def _manifest(store: LocalEvidenceStore) -> Manifest:
    prefix = attempt_prefix("r1", 2)
    items = []
    for name, data in (("crash-report.json", b"{}"), ("logs/train-r1-attempt-2.log", b"loss=nan\n")):
        stored = store.put_bytes(f"{prefix}/{name}", data)
        items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, "entrypoint", "2026-01-01T00:00:00+00:00"))
    missing = (MissingItem("coredumps", "entrypoint", "SIGTERM does not produce a core dump"),)
    return Manifest("r1", 2, "2026-01-01T00:00:01+00:00", tuple(items), missing)


def test_a_manifest_round_trips_through_the_store_and_verifies(store) -> None:
    manifest = _manifest(store)
    stored = write_manifest(store, manifest)

    assert stored.key == "runs/r1/attempt-2/manifest.json"
    assert read_manifest(store, "r1", 2) == manifest
    assert verify_manifest(store, manifest) == []


def test_added_items_are_listed_in_the_rewritten_manifest_and_replace_their_namesakes(store) -> None:
    write_manifest(store, _manifest(store))

    add_items(store, "r1", 2, {"verdict.json": b'{"category": "divergence"}'}, "flow", "2026-01-01T00:00:02+00:00")
    updated = add_items(store, "r1", 2, {"verdict.json": b'{"category": "nccl_error"}'}, "flow", "2026-01-01T00:00:03+00:00")

    assert read_manifest(store, "r1", 2) == updated
    assert [item.name for item in updated.items].count("verdict.json") == 1
    assert store.get_bytes("runs/r1/attempt-2/verdict.json") == b'{"category": "nccl_error"}'
    assert verify_manifest(store, updated) == [] and updated.missing == _manifest(store).missing


def test_verify_manifest_catches_a_tampered_and_a_vanished_object(store) -> None:
    manifest = _manifest(store)
    (store.root / "runs/r1/attempt-2/logs/train-r1-attempt-2.log").write_bytes(b"loss=0.1\n")
    (store.root / "runs/r1/attempt-2/crash-report.json").unlink()

    problems = verify_manifest(store, manifest)

    assert problems[0] == "runs/r1/attempt-2/crash-report.json: missing from the store"
    assert problems[1].startswith("runs/r1/attempt-2/logs/train-r1-attempt-2.log: sha256 is ")
    assert len(problems) == 2  # same size, different bytes: only the digest differs


def test_verify_manifest_reports_a_size_mismatch(store) -> None:
    manifest = _manifest(store)
    (store.root / "runs/r1/attempt-2/crash-report.json").write_bytes(b"{ }")

    assert "runs/r1/attempt-2/crash-report.json: size is 3 bytes, the manifest says 2" in verify_manifest(store, manifest)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"run_id": "r1", "attempt": "2", "created_at": "t", "items": [], "missing": []}', "'attempt'"),
        ('{"run_id": "r1", "attempt": 2, "created_at": "t", "items": [{"name": "x"}], "missing": []}', "'items'"),
        ('{"run_id": "r1", "attempt": 2, "created_at": "t", "items": []}', "'missing'"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(ManifestError, match=named):
        Manifest.from_json(text)


def test_attempt_prefix_refuses_unsafe_run_ids() -> None:
    assert attempt_prefix("llama-ft", 3) == "runs/llama-ft/attempt-3"
    with pytest.raises(ValueError, match="run_id"):
        attempt_prefix("../x", 1)
    with pytest.raises(ValueError, match="attempt"):
        attempt_prefix("r1", 0)


def _fill(disk: Path) -> None:
    """Write into ``disk`` until it says it is full."""
    with (disk / "filler").open("wb") as out:
        with pytest.raises(OSError, match="No space left"):
            while True:
                out.write(b"x" * 65536)
                out.flush()


def test_a_full_disk_still_takes_the_manifest_and_verdict_it_set_space_aside_for(small_disk: Path) -> None:
    store = LocalEvidenceStore(small_disk / "evidence")
    assert reserve_space(store, "r1", 1) is None
    _fill(small_disk)
    with pytest.raises(EvidenceStoreError, match="No space left on device"):
        store.put_bytes("runs/r1/attempt-1/crash-tail.txt", b"t" * 20_000)  # not reserved: refused
    manifest = store_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (), (
        MissingItem("crash-tail.txt", "local-workspace", "could not collect: EvidenceStoreError: no space"),)), "flow")

    verdict = AttemptSummary("r1", 1, 3, "Failed", category="code_error", signature="x" * 6000)
    problems = verdicts.keep(store, verdict, "flow").summary.storage_problems
    assert not [p for p in problems if "verdict.json" in p], problems  # the verdict took the space set aside
    kept = read_manifest(store, "r1", 1)
    assert [item.name for item in kept.items] == ["verdict.json"] and kept.missing == manifest.missing
    assert storage_failures(kept) == ["evidence crash-tail.txt: EvidenceStoreError: no space"]
    release_space(store, "r1", 1)
    assert store.list_keys("runs/") == ["runs/r1/attempt-1/manifest.json", "runs/r1/attempt-1/verdict.json"]
    assert sorted(p.name for p in (small_disk / "evidence/runs/r1/attempt-1").iterdir()) == ["manifest.json", "verdict.json"]


def test_without_space_set_aside_a_lost_manifest_and_verdict_are_reported_not_raised(small_disk: Path) -> None:
    store = LocalEvidenceStore(small_disk / "evidence")
    _fill(small_disk)
    assert "No space left on device" in (reserve_space(store, "r1", 1) or "")
    manifest = store_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (), ()), "flow")

    problem = verdicts.keep(store, AttemptSummary("r1", 1, 3, "Failed", signature="x" * 10000), "flow").summary.storage_problems[0]
    assert [item.name for item in manifest.missing] == ["manifest.json"]
    assert storage_failures(manifest)[0].startswith("evidence manifest.json: could not store the manifest")
    assert problem.startswith("verdict.json could not be stored") and "No space" in problem


def test_an_original_name_is_kept_only_where_the_printable_name_differs_and_older_manifests_still_read() -> None:
    odd = ManifestItem("coredumps/%1B[31mcore", "runs/r1/attempt-1/coredumps/%1B[31mcore", "0" * 64, 4, "entrypoint",
                       "2026-01-01T00:00:00+00:00", original_name="coredumps/\x1b[31mcore")
    plain = ManifestItem("crash-report.json", "runs/r1/attempt-1/crash-report.json", "1" * 64, 2, "entrypoint",
                         "2026-01-01T00:00:00+00:00")
    gone = MissingItem("snapshot/%E2%80%AEx", "entrypoint", "a symbolic link, not followed", "snapshot/\u202ex")
    manifest = Manifest("r1", 1, "2026-01-01T00:00:00+00:00", (odd, plain), (gone,))

    text = manifest.to_json()

    assert Manifest.from_json(text) == manifest
    assert text.count('"original_name"') == 2 and "\x1b" not in text and "\u202e" not in text
    older = text.replace(',\n      "original_name": "coredumps/\\u001b[31mcore"', "").replace(
        ',\n      "original_name": "snapshot/\\u202ex"', "")
    assert "original_name" not in older
    assert Manifest.from_json(older).items[0].original_name == ""


def test_a_manifest_nested_beyond_reading_is_a_one_line_manifest_error() -> None:
    with pytest.raises(ManifestError, match="nested too deeply"):
        Manifest.from_json("[" * 100_000 + "]" * 100_000)


def test_an_item_that_could_not_exist_reads_back_as_not_applicable_and_a_wrong_flag_is_named() -> None:
    manifest = Manifest("r1", 2, "t", (), (MissingItem("gpu/nvidia-smi.txt", "entrypoint", "no NVIDIA driver",
                                                         applicable=False),))

    assert Manifest.from_json(manifest.to_json()) == manifest and Manifest.from_json(manifest.to_json()).absent == ()
    with pytest.raises(ManifestError, match="'applicable' must be true or false"):
        Manifest.from_json(manifest.to_json().replace("false", '"no"'))
