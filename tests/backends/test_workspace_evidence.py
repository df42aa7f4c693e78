"""Evidence collection after real attempts: every item verifies, every gap has a reason, nothing raises."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from blocks.backends import LocalProcessBackend
from blocks.slurm import SlurmBackend as SlurmBackendBlock
from trainguard_entrypoint import acks

from trainguard.core.backends.base import Backend
from trainguard.core.backends.forensics import flight_recorder_env
from trainguard.core.backends.jobfiles import Budget
from trainguard.core.backends.workspace_evidence import collect_local_evidence, newest_checkpoints, verified
from trainguard.core.backends.local.runner import LocalProcessRunner
from trainguard.core.evidence.manifest import Manifest, read_manifest, verify_manifest
from trainguard.core.stores.base import EvidenceStoreError, StoredItem
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.backends.workspace import COREDUMPS, AttemptWorkspace, torchrun_env

CRASHING_TRAINER = """
import os, signal
ckpt = os.environ["TRAINGUARD_CHECKPOINT_DIR"]
for step in (1, 2):
    print(f"step {step} loss {1.0 / step}")
    with open(os.path.join(ckpt, f"step-{step:06d}.pt"), "wb") as f:
        f.write(b"weights-%d" % step)
open(os.path.join(ckpt, "step-000003.pt.tmp"), "wb").write(b"half-saved")
print("Segmentation fault coming", flush=True)
os.kill(os.getpid(), signal.SIGSEGV)
"""


@pytest.fixture
def workspace(tmp_path: Path) -> AttemptWorkspace:
    return AttemptWorkspace.create(tmp_path / "work", "run-1", 1)


@pytest.fixture
def store(tmp_path: Path) -> LocalEvidenceStore:
    return LocalEvidenceStore(tmp_path / "evidence")


def _run(workspace: AttemptWorkspace, code: str, **limits: float) -> None:
    LocalProcessRunner(grace_seconds=1.0, on_line=lambda line: None).run(
        [sys.executable, "-c", code], workspace=workspace, **limits
    )


def _names(manifest: Manifest) -> set[str]:
    return {item.name for item in manifest.items}


def _reasons(manifest: Manifest) -> dict[str, str]:
    return {item.name: item.reason for item in manifest.missing}


def test_a_crashed_attempt_is_collected_completely_and_every_item_verifies(workspace, store) -> None:
    _run(workspace, CRASHING_TRAINER)

    manifest = collect_local_evidence(workspace, store, extra={"classification.json": b'{"category": "native_crash"}'})

    assert {
        "logs/train-run-1-attempt-1.log", "crash-tail.txt", "snapshot/env.json", "snapshot/host.json",
        "snapshot/gpu-before/index.json", "snapshot/gpu-after/index.json", "crash-report.json", "runner.json",
        "checkpoints.json", "checkpoint/step-000002.pt", "classification.json",
    } <= _names(manifest)
    assert verify_manifest(store, manifest) == []
    assert read_manifest(store, "run-1", 1) == manifest
    prefix = "runs/run-1/attempt-1"
    assert store.get_bytes(f"{prefix}/checkpoint/step-000002.pt") == b"weights-2"
    assert store.get_bytes(f"{prefix}/crash-tail.txt").decode().endswith("Segmentation fault coming\n")
    assert json.loads(store.get_bytes(f"{prefix}/crash-report.json"))["signal_name"] == "SIGSEGV"
    listing = json.loads(store.get_bytes(f"{prefix}/checkpoints.json"))
    assert [f["name"] for f in listing["files"]] == ["step-000001.pt", "step-000002.pt", "step-000003.pt.tmp"]
    digests = {f["name"]: f["sha256"] for f in listing["files"]}
    copied = next(item for item in manifest.items if item.name == "checkpoint/step-000002.pt")
    assert digests["step-000002.pt"] == copied.sha256 == hashlib.sha256(b"weights-2").hexdigest()
    reasons = _reasons(manifest)
    assert reasons["snapshot/gpu-before/nvidia-smi-q.txt"] == "nvidia-smi not found on PATH"
    core_kept = any(name.startswith("coredumps/") for name in _names(manifest))
    assert core_kept or reasons["coredumps"], "either a core is kept or the reason is given"
    assert {item.source for item in manifest.items} == {"entrypoint", "runner", "local-workspace", "flow"}
    written = {key: Path(store.describe(key)).stat().st_mtime_ns for key in store.list_keys(f"{prefix}/")}
    assert written[f"{prefix}/manifest.json"] == max(written.values()), "the manifest is written last"
    assert all(item.collected_at.endswith("+00:00") for item in manifest.items)


def test_an_entrypoint_killed_before_its_report_leaves_reasons_not_exceptions(workspace, store) -> None:
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('hung', flush=True); time.sleep(60)"
    _run(workspace, ignore_term, deadline_seconds=3.0)

    manifest = collect_local_evidence(workspace, store)

    reasons = _reasons(manifest)
    assert "killed (SIGKILL) before writing its crash report" in reasons["crash-report.json"]
    assert "DeadlineExceeded" in reasons["crash-report.json"]
    assert reasons["coredumps"] == "no core file, and no crash report to say why"
    assert "snapshot/gpu-after/index.json" in reasons
    assert {"runner.json", "logs/train-run-1-attempt-1.log", "snapshot/env.json"} <= _names(manifest)
    assert store.get_bytes("runs/run-1/attempt-1/crash-tail.txt") == b"hung\n"
    assert verify_manifest(store, manifest) == []


def test_a_workspace_where_nothing_ran_gives_a_manifest_of_reasons(workspace, store) -> None:
    manifest = collect_local_evidence(workspace, store)

    reasons = _reasons(manifest)
    assert reasons["crash-report.json"] == "no crash report and no runner.json: the attempt may never have run here"
    assert reasons["checkpoint"] == f"no checkpoint in {workspace.checkpoint_dir}"
    assert "logs/train-run-1-attempt-1.log" in reasons
    assert _names(manifest) == {"checkpoints.json"}
    assert store.exists("runs/run-1/attempt-1/manifest.json")


class _RefusingStore(LocalEvidenceStore):
    """A real folder store that fails for one key, like a full disk or a dropped connection would."""

    def __init__(self, root: Path, refused: str) -> None:
        super().__init__(root)
        self.refused = refused

    def put_file(self, key: str, path: Path) -> StoredItem:
        if key.endswith(self.refused):
            raise EvidenceStoreError(f"cannot write {key!r}: No space left on device")
        return super().put_file(key, path)


def test_a_failure_on_one_item_is_recorded_and_the_others_are_still_collected(workspace, tmp_path: Path) -> None:
    _run(workspace, "raise SystemExit(1)")
    os.symlink(tmp_path / "gone", workspace.root / COREDUMPS / "core.dangling")
    store = _RefusingStore(tmp_path / "evidence", "snapshot/env.json")

    manifest = collect_local_evidence(workspace, store, extra={"bad/../name": b"x", "classification.json": b"{}"})

    reasons = _reasons(manifest)
    assert reasons["snapshot/env.json"].startswith("could not collect: EvidenceStoreError: ")
    assert "No space left on device" in reasons["snapshot/env.json"]
    assert reasons["coredumps/core.dangling"].endswith("core.dangling: a symbolic link, not followed")
    assert "'..' is not allowed" in reasons["bad/../name"]
    assert {"crash-report.json", "runner.json", "snapshot/host.json", "classification.json"} <= _names(manifest)
    assert verify_manifest(store, manifest) == []


def test_a_manifest_that_cannot_be_stored_is_reported_in_the_returned_manifest(workspace, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")

    manifest = collect_local_evidence(workspace, LocalEvidenceStore(blocker))

    assert "could not store the manifest" in _reasons(manifest)["manifest.json"]
    assert manifest.items == ()


def test_the_newest_checkpoint_over_the_limit_is_listed_but_not_copied(workspace, store) -> None:
    (workspace.checkpoint_dir / "step-000010.pt").write_bytes(b"x" * 2048)

    manifest = collect_local_evidence(workspace, store, budget=Budget(checkpoint_bytes=1024))

    assert "2048 bytes (apparent size), over the checkpoint budget (1024 bytes left of 1024)" in \
        _reasons(manifest)["checkpoint/step-000010.pt"]
    assert "checkpoints.json" in _names(manifest)


def test_a_checkpoint_folder_is_copied_file_by_file(workspace, store) -> None:
    shard_dir = workspace.checkpoint_dir / "checkpoint-500"
    (shard_dir / "shards").mkdir(parents=True)
    (shard_dir / "config.json").write_bytes(b"{}")
    (shard_dir / "shards" / "rank0.bin").write_bytes(b"rank0")

    manifest = collect_local_evidence(workspace, store)

    assert {"checkpoint/checkpoint-500/config.json", "checkpoint/checkpoint-500/shards/rank0.bin"} <= _names(manifest)


def test_collected_at_comes_from_the_injected_clock(workspace, store) -> None:
    fixed = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    manifest = collect_local_evidence(workspace, store, now=lambda: fixed)

    assert manifest.created_at == "2026-03-01T12:00:00+00:00"
    assert {item.collected_at for item in manifest.items} == {"2026-03-01T12:00:00+00:00"}


def _touch(folder: Path, name: str, mtime: float, content: bytes = b"weights") -> None:
    path = folder / name
    path.write_bytes(content)
    os.utime(path, (mtime, mtime))


def test_newest_checkpoints_orders_by_step_number_not_by_name_or_mtime(tmp_path: Path) -> None:
    _touch(tmp_path, "step-000120.pt", 100)
    _touch(tmp_path, "step-99.pt", 300)
    _touch(tmp_path, "step-000200.pt", 200)

    assert [p.name for p in newest_checkpoints(tmp_path)] == ["step-000200.pt", "step-000120.pt", "step-99.pt"]


def test_newest_checkpoints_ignores_partial_temporary_and_hidden_files(tmp_path: Path) -> None:
    _touch(tmp_path, "step-000100.pt", 100)
    for name in ("step-000200.pt.tmp", "step-000300.pt.partial", ".step-000400.pt"):
        _touch(tmp_path, name, 500)

    assert [p.name for p in newest_checkpoints(tmp_path)] == ["step-000100.pt"]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ({"epoch=1-step=900.ckpt": 1, "epoch=2-step=1800.ckpt": 2}, ["epoch=2-step=1800.ckpt", "epoch=1-step=900.ckpt"]),
        ({"checkpoint-500": 2, "checkpoint-1000": 1}, ["checkpoint-1000", "checkpoint-500"]),
        ({"best.pt": 1, "latest.pt": 3, "old.pt": 2}, ["latest.pt", "old.pt", "best.pt"]),
    ],
)
def test_newest_checkpoints_reads_common_naming_schemes(tmp_path: Path, names: dict[str, int], expected: list[str]) -> None:
    for name, mtime in names.items():
        _touch(tmp_path, name, mtime)

    assert [p.name for p in newest_checkpoints(tmp_path)] == expected


def test_newest_checkpoints_skips_empty_files_and_folders_a_full_disk_leaves(tmp_path: Path) -> None:
    _touch(tmp_path, "step-000100.pt", 100)
    _touch(tmp_path, "step-000200.pt", 200, content=b"")
    (tmp_path / "checkpoint-300").mkdir()

    assert [p.name for p in newest_checkpoints(tmp_path)] == ["step-000100.pt"]


def test_newest_checkpoints_of_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert newest_checkpoints(tmp_path / "nope") == []


RANKED_TRAINER = """
import json, os, time
ws = os.environ["TRAINGUARD_WORKSPACE"]
log = os.path.join(os.environ["PET_LOG_DIR"], "run_0", "attempt_0", "0", "stdout.log")
os.makedirs(os.path.dirname(log))
open(log, "w").write("step 1 token " + os.environ["HF_TOKEN"] + "\\n")
os.makedirs(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]), exist_ok=True)
json.dump({"message": {"message": "RuntimeError: boom"}}, open(os.environ["TORCHELASTIC_ERROR_FILE"], "w"))
recorder = os.path.dirname(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"])
os.makedirs(recorder, exist_ok=True)
open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + "0", "wb").write(b"flight recorder of rank 0")
os.mkfifo(os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + "0")
open(os.path.join(ws, "dump-stacks"), "w").close()
while not os.path.exists(os.path.join(ws, "stacks", "index.json")):
    time.sleep(0.1)
"""


def test_rank_logs_error_files_stacks_and_flight_recorder_dumps_are_kept_masked_without_helpers(
        workspace, store) -> None:
    env = {"HF_TOKEN": "hf_RankLogSecretNeverStored01", **flight_recorder_env(str(workspace.root)),
           **torchrun_env(str(workspace.root))}
    LocalProcessRunner(grace_seconds=1.0, on_line=lambda line: None).run(
        [sys.executable, "-c", RANKED_TRAINER], workspace=workspace, env=env, deadline_seconds=120)
    manifest = collect_local_evidence(workspace, store)
    names = _names(manifest)
    assert {"ranks/run_0/attempt_0/0/stdout.log", "torchelastic/error.json", "stacks/index.json",
            "stacks/rank-0.txt", "flight-recorder/rank_0"} <= names
    assert not any("site" in name or "pipe_" in name for name in names | set(_reasons(manifest))), _reasons(manifest)
    stored = (store.root / "runs" / "run-1" / "attempt-1" / "ranks" / "run_0" / "attempt_0" / "0" / "stdout.log")
    assert "step 1 token" in stored.read_text() and "hf_RankLogSecretNeverStored01" not in stored.read_text()
    assert verify_manifest(store, manifest) == []


def _acknowledged(folder: Path, name: str, step: int, kind: str = "periodic") -> None:
    (folder / name).write_bytes(f"state of step {step}".encode() * 10)
    acks.write_ack(folder, acks.Ack(name, step, kind, acks.describe_files(folder, name), 0, 4, 1.0))


def test_a_checkpoint_whose_acknowledgement_does_not_verify_is_passed_over_for_the_newest_good_one(tmp_path: Path) -> None:
    _acknowledged(tmp_path, "step-000010.pt", 10)
    _acknowledged(tmp_path, "step-000016.pt", 16, "just_in_time")
    (tmp_path / "step-000016.pt").write_bytes(b"corrupt!" * 20)  # same size, other bytes

    assert [p.name for p in newest_checkpoints(tmp_path)] == ["step-000010.pt"]
    kept, left_out = verified([tmp_path / "step-000016.pt", tmp_path / "step-000010.pt"], tmp_path)
    assert [p.name for p in kept] == ["step-000010.pt"]
    assert left_out == [("step-000016.pt", "step-000016.pt: SHA-256 differs from the acknowledgement's")]


def test_unacknowledged_checkpoints_and_a_verified_newest_stay_ranked_as_before(tmp_path: Path) -> None:
    (tmp_path / "step-000005.pt").write_bytes(b"the training's own save")
    _acknowledged(tmp_path, "step-000010.pt", 10)
    (tmp_path / ".step-000012.pt.4242.tmp").write_bytes(b"a save the deadline cut short")

    assert [p.name for p in newest_checkpoints(tmp_path)] == ["step-000010.pt", "step-000005.pt"]


def _local_block(root: Path, **fields: object) -> Backend:
    return LocalProcessBackend(work_root=str(root), **fields).backend()


def _slurm_block(root: Path, **fields: object) -> Backend:
    return SlurmBackendBlock(shared_folder=str(root), **fields).backend()


@pytest.mark.parametrize("block", [_local_block, _slurm_block], ids=["local", "slurm"])
def test_a_backend_reading_its_own_folder_says_which_checkpoint_it_passes_over_and_hashes_within_its_blocks_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], block: Callable[..., Backend]) -> None:
    folder = block(tmp_path).checkpoint_folder("run-1")
    folder.mkdir(parents=True)
    for step in (10, 16, 20):
        _acknowledged(folder, f"step-{step:06d}.pt", step)
    (folder / "step-000020.pt").write_bytes(b"cut")  # a size that differs: seen without hashing
    (folder / "step-000016.pt").write_bytes(b"X" * 160)  # the same size, other bytes: seen only by hashing

    sizes_only = block(tmp_path, checkpoint_verify_seconds=0).checkpoints("run-1")

    assert [Path(path).name for path in sizes_only] == ["step-000016.pt", "step-000010.pt"]
    said = capsys.readouterr().out
    assert (f"trainguard: not resuming from {folder}/step-000020.pt: its files do not match its acknowledgement: "
            "step-000020.pt: 3 bytes, the acknowledgement says 160") in said
    assert (f"trainguard: {folder}/step-000016.pt: SHA-256 of 1 of 1 files (160 bytes) not compared: the time "
            "bound ran out; their sizes match") in said

    hashed = block(tmp_path).checkpoints("run-1")  # the default bound: 120 s, ample for 480 bytes

    assert [Path(path).name for path in hashed] == ["step-000010.pt"]
    said = capsys.readouterr().out
    assert f"not resuming from {folder}/step-000016.pt: its files do not match its acknowledgement: " \
           "step-000016.pt: SHA-256 differs from the acknowledgement's" in said
    assert "not compared" not in said
