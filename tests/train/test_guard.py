"""The guard in one process (no process group): notice, deadline, claims, refusals, and how it travels.

What needs several ranks (agreement, a survivor's save after gloo fails) runs under torchrun in
tests/flows/test_helper_attempts.py and test_helper_notice.py; here each rule is shown on its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
from services.ports import rendezvous_port

import trainguard_train as tg
from trainguard.core.backends import entrypoint_archive
from trainguard_entrypoint import acks
from trainguard_entrypoint.notice import Notice, write_notice
from trainguard_entrypoint.slurmnotice import TIMES_ENV
from trainguard_entrypoint.trainpath import helper_archive
from trainguard_train import shards

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("TRAINGUARD_NOTICE_FILE", "TRAINGUARD_RESUME_FROM", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINGUARD_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("TRAINGUARD_ATTEMPT", "3")
    monkeypatch.setenv("TRAINGUARD_NOTICE_GRACE_SECONDS", "25")
    return tmp_path / "ck"


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_sigterm_mid_step_saves_the_completed_step_with_a_notice_ack_and_stops_with_143(env: Path) -> None:
    model, optimizer = model_and_optimizer()
    reached = []
    with pytest.raises(tg.Stopped) as stopped, tg.Guard(model, optimizer, every=10) as guard:
        for step in guard.steps(guard.resume(), 100):
            reached.append(step)
            if step == 12:
                os.kill(os.getpid(), signal.SIGTERM)  # in the middle of step 13: it completes, then the stop

    assert stopped.value.code == 143 and reached[-1] == 12
    ack = acks.read_ack(env, "step-000013.pt")
    assert ack is not None and (ack.step, ack.kind) == (13, "notice") and acks.verify(env, ack) is None
    assert ack.notice is not None and ack.notice["reason"] == "terminated"
    assert ack.notice["deadline"] - ack.notice["given_at"] == 25 and ack.seconds_from_notice is not None
    assert torch.load(env / "step-000013.pt", weights_only=False)["step"] == 13
    assert (acks.read_ack(env, "step-000010.pt") or ack).kind == "periodic"
    assert signal.getsignal(signal.SIGTERM) is not guard._on_signal  # the handlers are given back


def test_a_notice_whose_step_was_just_saved_periodically_is_answered_by_that_checkpoint(env: Path) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(tg.Stopped), tg.Guard(model, optimizer, every=10) as guard:
        for step in guard.steps(guard.resume(), 100):
            if step == 19:
                os.kill(os.getpid(), signal.SIGTERM)  # in step 20, which is saved periodically as it ends

    assert sorted(p.name for p in env.iterdir() if not p.name.startswith(".")) == ["step-000010.pt", "step-000020.pt"]
    ack = acks.read_ack(env, "step-000020.pt")  # saved once, acknowledged as the notice's answer
    assert ack is not None and (ack.step, ack.kind) == (20, "notice") and acks.verify(env, ack) is None
    assert ack.notice is not None and ack.seconds_from_notice is not None
    progress = acks.read_progress(env)
    assert progress is not None and progress.step == 20


def test_the_notice_files_deadline_is_the_one_kept_and_a_save_that_overruns_it_leaves_nothing(
        env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notice_file = tmp_path / "notice.json"
    monkeypatch.setenv("TRAINGUARD_NOTICE_FILE", str(notice_file))
    write_notice(notice_file, Notice("eviction", time.time(), time.time() + 0.2, "kubelet SIGTERM, grace 0s"))

    def slow_save(step: int, path: Path) -> None:
        path.write_bytes(b"x" * 100)
        time.sleep(0.5)

    with pytest.raises(tg.Stopped), tg.Guard(save=slow_save) as guard:
        for step in guard.steps(0, 10):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    assert guard.notice is not None and guard.notice.reason == "eviction"
    assert sorted(p.name for p in env.iterdir()) == [".trainguard-acks"]  # no checkpoint, no temporary file
    assert acks.read_ack(env, "step-000003.pt") is None


def test_in_a_slurm_job_a_rank_signalled_before_the_notice_file_exists_acts_on_the_file_once_written(
        env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm signals every process of a step at once: the rank hears the preemption as early as the
    # entrypoint, which asks Slurm why before it writes the notice
    notice_file = tmp_path / "notice.json"
    monkeypatch.setenv("TRAINGUARD_NOTICE_FILE", str(notice_file))
    monkeypatch.setenv(TIMES_ENV, f"{time.time() - 60:.0f} 600 30")
    preemption = Notice("preemption", time.time(), time.time() + 45, "Slurm preemption")
    writer = threading.Timer(0.3, write_notice, (notice_file, preemption))

    def save(step: int, path: Path) -> None:
        path.write_bytes(b"x" * 100)

    with pytest.raises(tg.Stopped), tg.Guard(save=save) as guard:
        for step in guard.steps(0, 10):
            if step == 2:
                writer.start()
                os.kill(os.getpid(), signal.SIGTERM)
    writer.join()
    ack = acks.read_ack(env, "step-000003.pt")
    assert ack is not None and ack.notice == preemption.to_json()
    assert guard.notice == preemption


def test_a_loop_that_owns_its_checkpoint_code_gets_its_save_called_with_the_step(env: Path) -> None:
    saved = []

    def save(step: int, path: Path) -> None:
        saved.append(step)
        path.mkdir()
        (path / "model.bin").write_bytes(bytes([step]))

    with tg.Guard(save=save, every=4, name="ckpt-{step}") as guard:
        for step in range(0, 9):
            guard.step_done(step + 1)

    assert saved == [4, 8]
    ack = acks.read_ack(env, "ckpt-8")
    assert ack is not None and [f.name for f in ack.files] == ["ckpt-8/model.bin"] and acks.verify(env, ack) is None
    assert acks.read_progress(env) is not None


def test_one_survivor_claims_the_just_in_time_save_and_another_stands_down(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failure = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert tg.peer_lost(failure) and not tg.peer_lost(ValueError("bad shape")) and not tg.peer_lost(SystemExit(1))
    model, optimizer = model_and_optimizer()
    first, second = tg.Guard(model, optimizer), tg.Guard(model, optimizer)
    first.completed = second.completed = 7
    monkeypatch.setenv("RANK", "1")
    assert first.just_in_time(failure) == env / "step-000007.pt"
    monkeypatch.setenv("RANK", "0")
    assert second.just_in_time(failure) is None  # the claim is taken: it stands down
    ack = acks.read_ack(env, "step-000007.pt")
    assert ack is not None and (ack.kind, ack.saved_by_rank, ack.step) == ("just_in_time", 1, 7)
    assert "Connection reset by peer" in (ack.failure or "") and acks.verify(env, ack) is None


def test_a_survivor_on_its_way_out_takes_a_sigterm_as_a_notice_not_as_its_end(env: Path) -> None:
    # torchrun's agent SIGTERMs the survivors while they fail; the default action would end one
    # while torch's @record writes its error file, and the agent then crashes reading it empty
    model, optimizer = model_and_optimizer()
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(RuntimeError), tg.Guard(model, optimizer) as guard:
            for _ in guard.steps(guard.resume(), 10):
                raise RuntimeError("Connection reset by peer")
        assert signal.getsignal(signal.SIGTERM) == guard._on_signal
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, and the process goes on to write its error file
        assert guard.signalled is not None and guard.signalled[0] == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)
    with pytest.raises(ValueError), tg.Guard(model, optimizer) as other:  # any other failure: as it was
        for _ in other.steps(other.resume(), 10):
            raise ValueError("bad shape")
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_failure_before_any_step_completed_saves_nothing(env: Path) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(RuntimeError), tg.Guard(model, optimizer) as guard:
        for _ in guard.steps(guard.resume(), 10):
            raise RuntimeError("Connection closed by peer")
    assert not env.exists() or not list(env.glob("step-*"))


def test_sharded_state_gets_no_just_in_time_checkpoint_and_says_why(env: Path) -> None:
    class FullyShardedDataParallel(torch.nn.Module):  # the class name FSDP wraps a model in
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

    guard = tg.Guard(FullyShardedDataParallel())
    guard.completed = 5
    assert guard.just_in_time(RuntimeError("Connection reset by peer")) is None
    assert not list(env.glob("step-*"))
    why = (env / ".trainguard-acks" / "no-just-in-time-3.json").read_text()
    assert "sharded (FSDP)" in why and '"step": 5' in why


def test_a_stand_downs_view_never_replaces_the_claimers_reason_for_having_no_just_in_time_checkpoint(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # HSDP, 2 replicas x 2 shards. A survivor that stands down looks for a claim, then at each replica's
    # shards, then records what it saw; another survivor claims the save in between and its save runs
    # past the deadline. Both orders, forced.
    where = shards.Layout((2, 2), ((0, 1), (2, 3)))
    model, optimizer = model_and_optimizer()
    claimer, stood_down = tg.Guard(model, optimizer), tg.Guard(model, optimizer)
    record = env / ".trainguard-acks" / "no-just-in-time-3.json"

    def claimed_and_given_up() -> None:
        assert claimer._claim({"rank": 0, "replica": 0, "step": 5})
        claimer._give_up(env / ".step-000005.jit-3-replica0.tmp", 5, "just_in_time",
                         "ready 2.0s after the deadline; discarded")

    looked = shards.missing_shards
    def look_while_claimed(folder: Path, count: int) -> list[int]:
        if not claimer._claim_path().exists():
            claimed_and_given_up()
        return looked(folder, count)
    monkeypatch.setattr(shards, "missing_shards", look_while_claimed)
    stood_down._refuse_unless_claimed(5, where, "step-000005")
    assert claimer._claim_path().exists()  # the claim came after the stand-down looked for one
    assert "after the deadline" in json.loads(record.read_text())["reason"]

    monkeypatch.setattr(shards, "missing_shards", looked)
    for left in (record, claimer._claim_path()):
        left.unlink()
    stood_down._refuse_unless_claimed(5, where, "step-000005")
    assert "no replica of every shard survived" in json.loads(record.read_text())["reason"]
    claimed_and_given_up()
    assert "after the deadline" in json.loads(record.read_text())["reason"]


def test_a_survivor_that_learns_late_of_a_claimed_replica_writes_no_shard(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # HSDP at scale: every replica's survivors writing their shards is the whole state written once per
    # replica, at the moment the file system is needed for the one that counts.
    written: list[object] = []
    monkeypatch.setattr(shards, "shard_state", lambda *args: written.append(args) or {"step": 5})
    monkeypatch.setattr(shards, "write_shard", lambda *args: written.append(args))
    model, optimizer = model_and_optimizer()
    claimer, late = tg.Guard(model, optimizer), tg.Guard(model, optimizer)
    assert claimer._claim({"rank": 0, "replica": 0, "step": 5})
    late.completed = 5
    assert late._just_in_time_shards(shards.Layout((2, 2), ((0, 1), (2, 3))), 5, "Connection reset by peer",
                                      time.time()) is None
    assert written == [] and not list(env.glob(".step-000005.jit-*")) and not list(env.glob("step-*"))


# Two real gloo ranks: every tensor the guard hands dist.all_reduce, watched through a weak reference.
_COLLECTIVES = """
import gc, weakref
import torch, torch.distributed as dist
import trainguard_train as tg
dist.init_process_group("gloo")
handed, all_reduce = [], dist.all_reduce
def watched(tensor, *args, **kwargs):
    handed.append(weakref.ref(tensor))
    return all_reduce(tensor, *args, **kwargs)
dist.all_reduce = watched
model = torch.nn.Linear(4, 2)
guard = tg.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1))
for _ in guard.steps(0, 14):  # ten agreements to measure them, then the ranks agree on a cadence
    pass
gc.collect()
print(len(handed), sum(ref() is None for ref in handed), guard.agree_every)
dist.barrier()
dist.destroy_process_group()
"""


def test_every_tensor_the_guard_all_reduces_outlives_the_call(tmp_path: Path) -> None:
    # gloo's worker thread lets go of an all-reduce's tensor a moment after the caller's wait returns
    # (later on a loaded machine). A tensor whose Python object died first is freed there; when the
    # interpreter is finalizing by then, the thread must take the GIL, exits instead, and the process
    # aborts ("terminate called without an active exception") after its training completed. That
    # happened when the cadence was agreed on a few steps before the end (a resumed run's last steps).
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rendezvous_port()), "WORLD_SIZE": "2",
           "TRAINGUARD_CHECKPOINT_DIR": str(tmp_path / "ck"), "PYTHONPATH": str(ROOT)}
    ranks = [subprocess.Popen([sys.executable, "-c", _COLLECTIVES], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        ended = [rank.communicate(timeout=120) for rank in ranks]
    finally:  # a rank that never met its peer is not left waiting for it
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert [rank.returncode for rank in ranks] == [0, 0], ended
    for out, _ in ended:
        handed, freed, cadence = out.split()
        assert int(handed) >= 11 and int(cadence) >= 1, out
        assert freed == "0", f"{freed} of {handed} all-reduced tensors died with the call that handed them"


def test_the_helper_travels_in_the_zipapp_and_beside_a_source_tree_without_trainguard(tmp_path: Path) -> None:
    names = zipfile.ZipFile(__import__("io").BytesIO(entrypoint_archive.build())).namelist()
    assert "trainguard_train/guard.py" in names and "trainguard_entrypoint/acks.py" in names
    archive = helper_archive(tmp_path)
    assert archive is not None
    packages = {name.split("/")[0] for name in zipfile.ZipFile(archive).namelist()}
    assert packages == {"trainguard_train", "trainguard_entrypoint"}  # never trainguard itself
    code = "import trainguard_train.guard as g; print(g.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(archive)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"{archive}/trainguard_train/guard.py", done.stderr[-2000:]


def test_the_helper_installs_alone_from_its_wheel_with_pip(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "trainguard_entrypoint.trainpath", str(tmp_path / "dist")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.strip())
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                                str(tmp_path / "site"), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == [
        "trainguard_entrypoint", "trainguard_train", "trainguard_train-0.1.0.dist-info"]
    code = "import trainguard_train.guard as g; print(g.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "site" / "trainguard_train" / "guard.py")
