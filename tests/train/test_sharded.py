"""Sharded state (FSDP2 on gloo, real processes): a just-in-time checkpoint when a whole replica survived (HSDP).

Each test runs tests/train/fsdp_job.py: one launcher that imports torch once and forks the ranks of a
real FSDP2 training over gloo on CPU (a 2-D mesh "replicate" x "shard" for HSDP), one of which is
SIGKILLed after a number of completed steps; no GPU is needed, nothing is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard_entrypoint import acks
from trainguard_train import shards

HERE = Path(__file__).resolve().parent


def run_jobs(tmp_path: Path, *runs: dict[str, Any]) -> str:
    """Run the trainings one after the other; what their ranks said on stderr."""
    config = tmp_path / "runs.json"
    config.write_text(json.dumps([{"checkpoint_dir": str(tmp_path / "ck"), "grace": 30, **run} for run in runs]))
    done = subprocess.run([sys.executable, str(HERE / "fsdp_job.py"), str(config)], capture_output=True, text=True,
                          timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def exits(out: Path) -> list[int | None]:
    return list(json.loads((out / "exits.json").read_text()))


def state(path: Path) -> dict[str, Any]:
    return dict(torch.load(path, weights_only=False))


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    model = a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    optimizer = a["optimizer"].keys() == b["optimizer"].keys() and all(
        a["optimizer"][i].keys() == b["optimizer"][i].keys()
        and all(torch.equal(a["optimizer"][i][k], b["optimizer"][i][k]) for k in a["optimizer"][i])
        for i in a["optimizer"])
    return model and optimizer


def visible(checkpoints: Path) -> list[str]:
    return sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith("."))


def test_hsdp_a_whole_replica_survives_a_rank_killed_and_the_retry_resumes_every_shard_from_its_step(
        tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    said = run_jobs(
        tmp_path,
        {"out": str(tmp_path / "first"), "world": 4, "mesh": [2, 2], "steps": 8, "attempt": 1,
         "die": {"rank": 3, "at_step": 5}},
        {"out": str(tmp_path / "retry"), "world": 4, "mesh": [2, 2], "steps": 8, "attempt": 2, "every": 4,
         "resume": str(ck / "step-000005")})

    first = exits(tmp_path / "first")
    assert first[3] == -9 and all(code not in (0, None) for code in first[:3]), first  # the failure went on up
    ack = acks.read_ack(ck, "step-000005")
    # the ranks' own lines say which survivor wrote what, or why none saved: kept in the failure's message
    saves = "\n".join(line for line in said.splitlines() if line.startswith("trainguard:"))
    assert ack is not None and (ack.kind, ack.step, ack.world_size) == ("just_in_time", 5, 4), f"{ack}\n{saves}"
    assert acks.verify(ck, ack) is None and "Connection" in (ack.failure or "")
    assert sorted(f.name for f in ack.files) == ["step-000005/manifest.json", "step-000005/shard-00000-of-00002.pt",
                                                 "step-000005/shard-00001-of-00002.pt"]
    manifest = json.loads((ck / "step-000005" / "manifest.json").read_text())
    assert (manifest["step"], manifest["mesh_shape"], manifest["shards"]) == (5, [2, 2], 2)
    assert manifest["saved_by_ranks"] == [0, 1]  # replica 0 is whole: ranks 0 and 1, rank 3's replica is not
    assert not (ck / ".trainguard-acks" / "no-just-in-time-1.json").exists()
    assert not [p.name for p in ck.iterdir() if p.name.endswith(".tmp")]  # the other replica's shard is cleared

    assert exits(tmp_path / "retry") == [0, 0, 0, 0]
    assert said.count("resumed from") == 4 and "at step 5" in said
    for rank in range(4):  # every rank, both replicas, holds again the state it had after step 5
        assert same(state(tmp_path / "first" / f"before-{rank}.pt"), state(tmp_path / "retry" / f"resumed-{rank}.pt"))
    assert not same(state(tmp_path / "retry" / "resumed-0.pt"), state(tmp_path / "retry" / "final-0.pt"))
    periodic = acks.read_ack(ck, "step-000008")  # the retry's periodic save, shard by shard with every rank alive
    assert periodic is not None and periodic.kind == "periodic" and acks.verify(ck, periodic) is None
    assert visible(ck) == ["step-000005", "step-000008"]

    shard = ck / "step-000005" / "shard-00001-of-00002.pt"  # a shard changed after its save: not taken as good
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    assert "step-000005/shard-00001-of-00002.pt" in (acks.verify(ck, ack) or "")

    where = shards.Layout((4,), ((0, 1, 2, 3),))
    with pytest.raises(ValueError, match=r"saved for a model with other parameters \(0\.bias, 0\.weight, 2\.bias and 3 "):
        shards.load_shard(ck / "step-000005", torch.nn.Linear(1, 1), None, where, 0)


def test_sharded_state_resumes_on_a_mesh_that_shrank_or_has_more_shards(tmp_path: Path) -> None:
    # A node lost for good: the retry runs on fewer ranks (one replica of the same 2 shards, no replica
    # left); or the same ranks shard the state 4 ways. Each rank holds its piece of the whole saved state.
    ck = tmp_path / "ck"
    run_jobs(tmp_path,
             {"out": str(tmp_path / "first"), "world": 4, "mesh": [2, 2], "steps": 8, "attempt": 1, "every": 4},
             {"out": str(tmp_path / "shrunk"), "world": 2, "mesh": [2], "steps": 6, "attempt": 2,
              "resume": str(ck / "step-000004")},
             {"out": str(tmp_path / "wider"), "world": 4, "mesh": [4], "steps": 6, "attempt": 3,
              "resume": str(ck / "step-000004")})
    assert exits(tmp_path / "shrunk") == [0, 0] and exits(tmp_path / "wider") == [0, 0, 0, 0]
    saved = [torch.load(ck / "step-000004" / f"shard-0000{k}-of-00002.pt", weights_only=False) for k in (0, 1)]
    whole = {key: torch.cat([s["model"][key] for s in saved]) for key in saved[0]["model"]}
    adam = {(i, k): torch.cat([s["optimizer"]["state"][i][k] for s in saved]) if k != "step" else saved[0]["optimizer"]["state"][i][k]
            for i in saved[0]["optimizer"]["state"] for k in saved[0]["optimizer"]["state"][i]}
    for run, pieces in (("shrunk", 2), ("wider", 4)):
        for rank in range(pieces):
            expected = {"model": {key: value.chunk(pieces)[rank] for key, value in whole.items()},
                        "optimizer": {i: {k: (v.chunk(pieces)[rank] if k != "step" else v) for (j, k), v in adam.items()
                                          if j == i} for i in saved[0]["optimizer"]["state"]}}
            assert same(expected, state(tmp_path / run / f"resumed-{rank}.pt")), (run, rank)


def test_fully_sharded_state_without_a_replica_gets_no_just_in_time_checkpoint_and_the_reason(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run_jobs(tmp_path, {"out": str(tmp_path / "first"), "world": 2, "mesh": [2], "steps": 6, "attempt": 1,
                        "die": {"rank": 1, "at_step": 3}})

    assert exits(tmp_path / "first") == [1, -9]  # the survivor's failure went on up after its refusal
    record = json.loads((ck / ".trainguard-acks" / "no-just-in-time-1.json").read_text())
    assert record["step"] == 3 and record["attempt"] == "1"
    assert "fully sharded (FSDP) over 2 ranks, no replica" in record["reason"]
    assert visible(ck) == [] and not list(ck.glob(".step-*"))


def test_a_survivor_killed_while_it_writes_its_shard_leaves_nothing_that_looks_whole(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run_jobs(tmp_path, {"out": str(tmp_path / "first"), "world": 4, "mesh": [2, 2], "steps": 8, "attempt": 1,
                        "die": {"rank": 3, "at_step": 5}, "die_in_save": 1})

    assert [code for code in exits(tmp_path / "first")][1::2] == [-9, -9]  # rank 1 mid-save, rank 3 before
    assert visible(ck) == [] and acks.read_ack(ck, "step-000005") is None
    record = json.loads((ck / ".trainguard-acks" / "no-just-in-time-1.json").read_text())
    assert record["step"] == 5 and "no replica of every shard survived" in record["reason"]
    assert "shard of rank 1" in record["reason"] and "shard of rank 3" in record["reason"]
    left = ck / ".step-000005.jit-1-replica0.tmp"  # only dot-names are left: never taken for a checkpoint
    assert left.is_dir() and not (left / shards.MANIFEST).exists()
    with pytest.raises(ValueError, match="not a whole sharded checkpoint"):
        shards.load_shard(left, torch.nn.Linear(1, 1), None, shards.Layout((2, 2), ((0, 1), (2, 3))), 0)


def test_hsdp_a_survivors_save_slower_than_the_grace_is_discarded_and_says_so(tmp_path: Path) -> None:
    ck = tmp_path / "ck"  # a grace of 0 s: the survivor that completes a replica is always past it
    run_jobs(tmp_path, {"out": str(tmp_path / "first"), "world": 4, "mesh": [2, 2], "steps": 8, "attempt": 1,
                        "die": {"rank": 3, "at_step": 5}, "grace": 0})

    assert exits(tmp_path / "first")[3] == -9
    assert visible(ck) == [] and acks.read_ack(ck, "step-000005") is None
    assert not list(ck.glob(".step-000005.jit-1-replica0.tmp"))  # the whole replica's folder, removed
    record = json.loads((ck / ".trainguard-acks" / "no-just-in-time-1.json").read_text())
    assert record["step"] == 5 and "after the deadline" in record["reason"]


def test_hsdp_a_notice_saves_the_agreed_step_shard_by_shard_and_every_rank_stops(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run_jobs(tmp_path, {"out": str(tmp_path / "first"), "world": 4, "mesh": [2, 2], "steps": 8, "attempt": 1,
                        "notice": {"rank": 2, "at_step": 3}})

    assert exits(tmp_path / "first") == [143, 143, 143, 143]
    ack = acks.read_ack(ck, "step-000004")  # step 3 (the fourth) completes, then all stop
    assert ack is not None and (ack.kind, ack.step) == ("notice", 4) and acks.verify(ck, ack) is None
    assert ack.notice is not None and ack.notice["reason"] == "terminated"
    assert visible(ck) == ["step-000004"] and not [p.name for p in ck.iterdir() if p.name.endswith(".tmp")]
    assert json.loads((ck / "step-000004" / "manifest.json").read_text())["saved_by_ranks"] == [0, 1]
