"""The checkpoint lister pod against kubesim: it reads the run's checkpoint PVC with the training
image's Python, passes over a newest checkpoint whose files no longer match its acknowledgement,
hands the acknowledgements and the helper's progress to the verdict, and is not broken or held by
hostile files in the acknowledgements folder. The checkpoint folders are written straight onto
kubesim's PVC folder, as a training job would leave them; the pods are real."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import kubesim.fixture
from trainguard.core.backends.capabilities import ListsCheckpoints
from trainguard.core.backends.kubernetes import lister
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core.checkpoints import facts
from trainguard_entrypoint import acks

NOTICE = {"version": 1, "reason": "eviction", "given_at": 1000.0, "deadline": 1030.0, "source": "test"}


def backend(kube: KubeApi, ns: str, tmp_path: Path, **fields: Any) -> KubernetesBackend:
    return KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                        local_root=str(tmp_path), **fields))


def run_folder(sim: kubesim.fixture.Sim, ns: str, run_id: str) -> Path:
    folder = sim.root / "pvc" / ns / "trainguard-checkpoints" / run_id
    folder.mkdir(parents=True)
    return folder


def saved(folder: Path, name: str, step: int, kind: str, data: bytes = b"weights", **more: Any) -> acks.Ack:
    """A checkpoint and its acknowledgement, written as the training-side helper writes them."""
    (folder / name).write_bytes(data)
    ack = acks.Ack(checkpoint=name, step=step, kind=kind, files=acks.describe_files(folder, name), saved_by_rank=0,
                   world_size=2, written_at=time.time(), **more)
    acks.write_ack(folder, ack)
    return ack


def test_a_corrupted_or_cut_short_newest_checkpoint_is_passed_over_for_the_next_older_with_why(
        kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = run_folder(sim, ns, "r-acks")
    saved(folder, "step-000010.pt", 10, "periodic")
    (folder / "step-000015.pt").write_bytes(b"the training's own save")  # no acknowledgement: kept as it is
    os.utime(folder / "step-000015.pt", (1000, 1000))
    saved(folder, "step-000020.pt", 20, "periodic")
    saved(folder, "step-000030.pt", 30, "notice", data=b"x" * 3_000_000, notice=NOTICE, seconds_from_notice=2.5)
    with (folder / "step-000030.pt").open("r+b") as corrupt:  # one flipped byte, the size unchanged
        corrupt.seek(2_000_000)
        corrupt.write(b"y")
    saved(folder, "step-000040.pt", 40, "notice", notice=NOTICE, seconds_from_notice=1.0)
    with (folder / "step-000040.pt").open("r+b") as cut:  # what a save killed mid-write would leave
        cut.truncate(3)
    acks.write_progress(folder, 41, "1")

    b = backend(kube, ns, tmp_path)
    assert isinstance(b, ListsCheckpoints) and b.checkpoint_listing("r-acks") is None  # nothing listed yet
    assert b.checkpoints("r-acks") == [f"/trainguard/checkpoints/r-acks/step-0000{n}.pt" for n in (20, 15, 10)]

    listing = b.checkpoint_listing("r-acks")
    assert listing is not None
    assert listing.left_out == (
        ("step-000040.pt", "step-000040.pt: 3 bytes, the acknowledgement says 7"),
        ("step-000030.pt", "step-000030.pt: SHA-256 differs from the acknowledgement's"))
    said = capsys.readouterr().out
    assert ("not resuming from /trainguard/checkpoints/r-acks/step-000040.pt: its files do not match its "
            "acknowledgement: step-000040.pt: 3 bytes, the acknowledgement says 7") in said
    assert listing.unchecked == () and listing.notes == ()
    assert {name: (a.kind, a.step, a.files, a.size_bytes) for name, a in listing.acks.items()} == {
        "step-000040.pt": ("notice", 40, 1, 7), "step-000030.pt": ("notice", 30, 1, 3_000_000),
        "step-000020.pt": ("periodic", 20, 1, 7), "step-000010.pt": ("periodic", 10, 1, 7)}
    assert listing.acks["step-000030.pt"].notice_reason == "eviction"
    assert listing.progress == acks.Progress(41, listing.progress.at, "1")

    # the verdict's facts from that one listing: attempt 2 resumed from step 10 and left step 20
    found = facts(b, "r-acks", 1, "/trainguard/checkpoints/r-acks/step-000010.pt",
                  "/trainguard/checkpoints/r-acks/step-000020.pt")
    assert (found.resumed_from_kind, found.resumed_from_step) == ("periodic", 10)
    assert (found.newest_kind, found.newest_step, found.progress_step, found.steps_lost) == ("periodic", 20, 41, 21)
    unacked = facts(b, "r-acks", 2, "/trainguard/checkpoints/r-acks/step-000015.pt", None)
    assert (unacked.resumed_from_kind, unacked.resumed_from_step, unacked.progress_step) == ("periodic", 15, None)


def test_hashing_past_the_time_bound_keeps_a_checkpoint_whose_sizes_match_and_says_so(
        kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path) -> None:
    folder = run_folder(sim, ns, "r-bound")
    saved(folder, "step-000010.pt", 10, "periodic", data=os.urandom(8 * 1024 * 1024))
    b = backend(kube, ns, tmp_path, checkpoint_verify_seconds=0)
    assert b.checkpoints("r-bound") == ["/trainguard/checkpoints/r-bound/step-000010.pt"]
    listing = b.checkpoint_listing("r-bound")
    assert listing is not None and listing.left_out == ()
    assert listing.unchecked == (("step-000010.pt", "SHA-256 of 1 of 1 files (8388608 bytes) not compared: the "
                                                    "time bound ran out; their sizes match"),)


def test_hostile_acknowledgements_neither_break_nor_hold_the_lister(
        kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path) -> None:
    folder = run_folder(sim, ns, "r-hostile")
    names = [f"step-0000{n}.pt" for n in (10, 20, 30, 40, 50, 60)]
    for name in names:
        (folder / name).write_bytes(b"weights")
    hidden = folder / ".trainguard-acks"
    hidden.mkdir()
    with (hidden / f"{names[5]}.json").open("wb") as huge:  # a 2 GB ack (sparse: it costs the job nothing)
        huge.truncate(2 * 1024 ** 3)
    (hidden / f"{names[4]}.json").write_bytes(b"\xff\xfe{\"version\": 1, \x1b[31m" * 1000)  # neither UTF-8 nor JSON
    (hidden / f"{names[3]}.json").symlink_to("/etc/passwd")
    os.mkfifo(hidden / f"{names[2]}.json")  # a reader that opened it would wait forever
    forged = {"version": 1, "checkpoint": names[1], "step": 20, "kind": "periodic", "saved_by_rank": 0,
              "world_size": 1, "written_at": 1.0, "files": [{"name": "../../etc/passwd", "size_bytes": 1,
                                                             "sha256": "0" * 64}]}
    (hidden / f"{names[1]}.json").write_text(json.dumps(forged))  # files outside the checkpoint
    (hidden / f"{names[0]}.json").write_text(json.dumps([[[[[[["deep"]]]]]]] * 100 + ["x" * 1000]))
    os.mkfifo(hidden / "progress.json")
    (folder / "step-000070.pt").symlink_to("/etc/passwd")  # a linked or FIFO checkpoint is none to resume from
    os.mkfifo(folder / "step-000080.pt")
    (folder / b"step-000090-\xff\x1b[2J.pt".decode("utf-8", "surrogateescape")).write_bytes(b"w")

    b = backend(kube, ns, tmp_path)
    started = time.monotonic()
    listed = b.checkpoints("r-hostile")
    took = time.monotonic() - started
    assert listed[0] == "/trainguard/checkpoints/r-hostile/step-000090-\udcff\x1b[2J.pt"  # its name as on disk
    assert listed[1:] == [f"/trainguard/checkpoints/r-hostile/{name}" for name in reversed(names)]
    listing = b.checkpoint_listing("r-hostile")
    assert listing is not None and listing.acks == {} and listing.progress is None and listing.left_out == ()
    assert took < b.settings.lister_timeout_seconds  # none of it held the pod to its timeout


@pytest.mark.parametrize(("log", "why"), [
    (b"", "printed no listing"), (b"Traceback ...\nImportError: no trainguard_entrypoint\n", "printed no listing"),
    (b'{"version": 1, "error": "OSError: \\u001b[2Jboom"}\n', "the checkpoint lister failed: OSError: boom"),
])
def test_an_answer_that_is_no_listing_is_refused_with_why(log: bytes, why: str) -> None:
    with pytest.raises(ValueError, match="checkpoint lister") as raised:
        lister.parse(log)
    assert why in str(raised.value)


def test_a_forged_answer_gives_only_what_a_listing_can_hold() -> None:
    answer = {"version": 1, "checkpoints": [["../../etc", 1.0], [".hidden", 1.0], ["a/b", 1.0], ["ok.pt", 2.0],
                                            ["ok.pt", 2.0], [7, 1.0], "x", ["part.tmp", 1.0]],
              "acks": {"ok.pt": {"version": 1, "checkpoint": "other.pt", "step": 1, "kind": "periodic", "files": 1,
                                 "size_bytes": 1, "written_at": 1.0},
                       "../x": {"version": 1, "checkpoint": "../x", "step": 1, "kind": "periodic", "files": 1,
                                "size_bytes": 1, "written_at": 1.0}},
              "progress": {"version": 1, "step": -3, "at": 1.0, "attempt": "1"},
              "left_out": [{"name": "bad\x1b[2J.pt", "reason": "\x1b]0;title\x07why"}, "junk"], "notes": "not a list"}
    listing = lister.parse(b"noise\n" + json.dumps(answer).encode() + b"\n")
    assert listing.checkpoints == ("ok.pt",) and listing.acks == {} and listing.progress is None
    assert listing.left_out == (("bad%1B[2J.pt", "why"),) and listing.notes == ()
