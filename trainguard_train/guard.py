"""The guard around a training loop: notice, agreement on a step, atomic saves with acks, just-in-time saves.

One `Guard` per training process. It keeps the number of optimizer steps completed (a step counts
only once the loop body that ran ``optimizer.step()`` has returned), and at step boundaries:

- saves a periodic checkpoint every ``every`` steps (the saving rank only: with DDP every rank holds
  the whole state, so rank 0 saves; sharded FSDP2 state is saved by the first replica's ranks, a
  shard each, see `trainguard_train.shards`);
- on a notice (SIGTERM or SIGINT, with the deadline of ``TRAINGUARD_NOTICE_FILE`` or now plus
  ``TRAINGUARD_NOTICE_GRACE_SECONDS``) all ranks agree on one step through a one-element
  ``all_reduce(MAX)`` of a flag, so no rank saves a step the others did not finish; the checkpoint is
  saved, acknowledged and every rank raises `Stopped` (exit status 128 + the signal);
- when the loop fails because a peer died (its collective fails: gloo's connection closed or reset,
  a ``DistError``), one survivor saves the state after the last completed step: the first to claim
  ``.trainguard-acks/just-in-time-<attempt>.claim`` with ``O_EXCL`` (lower ranks claim first), the
  others stand down, and the failure goes on up unchanged so the attempt still fails as it did.
  With HSDP each survivor writes its shard into its replica's dot-folder, and the survivor that
  completes a replica claims the save and puts the folder in place; fully sharded state (no
  replica) gets no just-in-time checkpoint, and why is recorded in
  ``.trainguard-acks/no-just-in-time-<attempt>.json``.

A save is written under a dot-name, fsynced, checked against the deadline and renamed into place;
only then is its acknowledgement written. A save that is killed or too late leaves only the
dot-name, which is never taken for a checkpoint.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist

from trainguard_entrypoint import acks
from trainguard_train import shards
from trainguard_entrypoint.files import read_json_object, write_json_atomic
from trainguard_entrypoint.notice import Notice, current_notice, grace_seconds
from trainguard_entrypoint.slurmnotice import TIMES_ENV

SaveFunction = Callable[[int, Path], None]
LoadFunction = Callable[[Path], int]
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
              "socket closed", "timed out", "nccl", "processgroup", "gloo", "peer")
_CHECK_COST = 0.005  # the agreement may cost this share of a step at most...
_CHECK_LATENCY_SECONDS = 1.0  # ...unless that would leave more than this between two agreements
_WARMUP_STEPS = 10
_SLURM_NOTICE_WAIT_SECONDS = 5.0  # at most this (and a quarter of the grace) for the entrypoint's notice


# Every tensor the guard all-reduces lives as long as the process: gloo's worker thread lets go of an
# all-reduce a moment after the caller's wait returns (later on a loaded machine). If the tensor's
# Python object died first (the guard freed when the loop's function returns, a local of the call),
# that late release deallocates it and must take the GIL; when the interpreter is already
# finalizing, the thread exits there and the process aborts ("terminate called without an active
# exception") after a training that completed. The cadence's proposal, agreed on a few steps before
# the end of a resumed run, did so.
@functools.cache
def _collective_tensor(purpose: str) -> torch.Tensor:
    """The one tensor the guard all-reduces for ``purpose`` ("agreement", "cadence"), for the process's life."""
    return torch.zeros(1)


class Stopped(SystemExit):
    """Raised on every rank once the notice checkpoint is saved: the attempt ends with 128 + the signal."""


def _say(message: str) -> None:
    try:
        print(f"trainguard: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank went away."""
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        return False
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc).lower() for word in _PEER_LOST)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def sharded(model: torch.nn.Module | None) -> bool:
    """Whether ``model``'s parameters are sharded across ranks (FSDP, FSDP2, HSDP), so no one rank holds them all."""
    if model is None:
        return False
    if shards.layout(model) is not None:
        return True
    names = {type(m).__name__ for m in model.modules()}
    return bool(names & {"FullyShardedDataParallel"}) or any(name.startswith("FSDP") for name in names)


def _fsync_tree(path: Path) -> None:
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for item in paths:
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    shards.fsync_dir(path.parent)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


class Guard:
    """Guards one training process's loop; see the module docstring and `steps`.

    Args:
        model: The model (DDP-wrapped or not); the default save and load use its state dict.
        optimizer: The optimizer; saved and loaded with the model by default.
        save: ``save(step, path)`` writes the checkpoint of ``step`` completed steps at ``path`` (a file
            or a folder; a temporary name the guard renames). Default: ``torch.save`` of
            ``{"model", "optimizer", "step"}``.
        load: ``load(path) -> step`` restores a checkpoint. Default: the counterpart of the default save.
        every: Steps between periodic checkpoints (None: none; notices and failures still save).
        checkpoint_dir: Default ``TRAINGUARD_CHECKPOINT_DIR`` (else ``checkpoints``).
        name: The checkpoint's name for a step, default ``step-{step:06d}.pt`` (``step-{step:06d}``, a
            folder of shards, for FSDP2 state saved by the default save).
        agree_every: Steps between agreements on a notice; None measures the collective in the first
            steps and agrees as often as keeps its cost under 0.5 % of a step (at least once a second).
        saving_rank: The rank that saves periodic and notice checkpoints (0).
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, *,
                 save: SaveFunction | None = None, load: LoadFunction | None = None, every: int | None = None,
                 checkpoint_dir: str | os.PathLike[str] | None = None, name: str | None = None,
                 agree_every: int | None = None, saving_rank: int = 0) -> None:
        if save is None and model is None:
            raise ValueError("Guard needs a model (and optimizer) to save, or a save function")
        if every is not None and every < 1:
            raise ValueError(f"every={every!r}: give a number of steps >= 1, or None for no periodic checkpoints")
        self.model, self.optimizer = model, optimizer
        self._save_fn = save or self._default_save
        self._load_fn = load or self._default_load
        self._own_save = save is not None
        self.every, self.saving_rank = every, saving_rank
        self._name = name
        self.checkpoint_dir = Path(checkpoint_dir or os.environ.get("TRAINGUARD_CHECKPOINT_DIR") or "checkpoints")
        self.attempt = os.environ.get("TRAINGUARD_ATTEMPT", "")
        self.completed: int | None = None  # optimizer steps completed, once known
        self.resumed_from: int | None = None
        self.signalled: tuple[int, float] | None = None
        self.notice: Notice | None = None
        self._notice_assumed = False  # the notice is the grace's, for want of a notice file
        self.agree_every = agree_every
        self._fixed_cadence = agree_every is not None
        self._previous: dict[int, Any] = {}
        self._flag = _collective_tensor("agreement")
        self._last_progress = 0.0
        self._last_boundary: float | None = None
        self._step_seconds: list[float] = []
        self._agree_seconds: list[float] = []
        self._known: tuple[int, int] | None = None
        self._sharding: shards.Layout | str | None | bool = False  # False: not looked at yet

    # ---- sharded state -------------------------------------------------------------------------------
    def layout(self) -> shards.Layout | str | None:
        """How the model's state is sharded (FSDP2's DTensors), read once: a `shards.Layout`, None when it
        is not DTensor-sharded, or why its layout cannot be saved shard by shard."""
        if self._sharding is False:
            self._sharding = shards.layout(self.model)
        assert self._sharding is not True
        return self._sharding

    def _shard_wise(self) -> shards.Layout | None:
        """The layout when the guard saves the state itself, shard by shard (the default save of FSDP2 or HSDP)."""
        where = self.layout()
        return where if isinstance(where, shards.Layout) and not self._own_save else None

    @property
    def name(self) -> str:
        """The checkpoint's name pattern: the one given, else ``step-{step:06d}`` for sharded state (a
        folder of shards) and ``step-{step:06d}.pt`` otherwise."""
        if self._name is not None:
            return self._name
        return "step-{step:06d}" if self._shard_wise() is not None else "step-{step:06d}.pt"

    # ---- ranks -------------------------------------------------------------------------------------
    def _ranks(self) -> tuple[int, int]:
        """(rank, world size), read once the process group exists (a step must not pay for it again)."""
        if self._known is not None:
            return self._known
        if dist.is_available() and dist.is_initialized():
            self._known = (dist.get_rank(), dist.get_world_size())
            return self._known
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def distributed(self) -> bool:
        return self._ranks()[1] > 1 and dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        return self._ranks()[0]

    @property
    def world_size(self) -> int:
        return self._ranks()[1]

    # ---- the context: signals in, failures caught ---------------------------------------------------
    def __enter__(self) -> Guard:
        self.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None or not peer_lost(exc):
            self.uninstall()
            return
        # A survivor on its way out keeps SIGTERM and SIGINT as recorded notices until it exits.
        # torchrun's agent ends the other workers with SIGTERM once one failed; with the default
        # action back, that would kill this one while torch's @record writes its error file, and an
        # empty error file makes the agent crash before it prints its failure table, the evidence
        # naming the rank that failed first. The agent still kills it if it does not exit.
        self.just_in_time(exc)

    def install(self) -> None:
        """Take SIGTERM and SIGINT as notices (recorded; acted on at the next step boundary)."""
        for signum in NOTICE_SIGNALS:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled is None:
            self.signalled = (signum, time.time())
        elif signum == signal.SIGINT:  # Ctrl-C a second time: the person does not want to wait for the save
            raise KeyboardInterrupt

    # ---- resuming ------------------------------------------------------------------------------------
    def resume(self) -> int:
        """Load ``TRAINGUARD_RESUME_FROM`` when trainguard names one; the steps it holds (0 without one)."""
        path = os.environ.get("TRAINGUARD_RESUME_FROM")
        step = self._load_fn(Path(path)) if path else 0
        if path:
            _say(f"resumed from {path} at step {step}")
        self.completed = self.resumed_from = step
        return step

    def _default_save(self, step: int, path: Path) -> None:
        assert self.model is not None
        state = {"model": _unwrap(self.model).state_dict(), "step": step,
                 "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None}
        torch.save(state, path)

    def _default_load(self, path: Path) -> int:
        assert self.model is not None
        where = self.layout()
        if isinstance(where, str):
            raise ValueError(f"TRAINGUARD_RESUME_FROM={path}: the model is sharded in a way the guard does not load "
                             f"({where}); pass load= to the Guard")
        if where is not None:
            return shards.load_shard(path, self.model, self.optimizer, where, self.rank)
        if path.is_dir() and (path / shards.MANIFEST).exists():
            raise ValueError(f"TRAINGUARD_RESUME_FROM={path}: a sharded checkpoint, and this model is not sharded; "
                             f"resume it with the same FSDP mesh")
        state = torch.load(path, map_location="cpu", weights_only=False)
        _unwrap(self.model).load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        return int(state["step"])

    # ---- the loop ------------------------------------------------------------------------------------
    def steps(self, first: int, total: int) -> Iterator[int]:
        """Step indices ``first`` .. ``total - 1``; a step counts as completed when the body returns."""
        self.completed = first
        for step in range(first, total):
            yield step
            self.step_done(step + 1)

    def step_done(self, completed: int) -> None:
        """Call after ``optimizer.step()`` returned (``completed`` steps in all); may save, or raise `Stopped`."""
        self.completed = completed
        now = time.time()
        if self._last_boundary is not None and len(self._step_seconds) < _WARMUP_STEPS:
            self._step_seconds.append(now - self._last_boundary)
        self._last_boundary = now
        where = self._shard_wise()
        if where is not None and self.every and completed % self.every == 0:
            self.save_shards(completed, "periodic", where)  # every rank takes part
        if self.rank == self.saving_rank:
            if where is None and self.every and completed % self.every == 0:
                self.save(completed, "periodic")
            if now - self._last_progress >= 1.0:
                self._progress(completed, now)
        if self._due(completed) and self.agree():
            self._stop(completed)

    def _progress(self, step: int, now: float) -> None:
        self._last_progress = now
        try:
            acks.write_progress(self.checkpoint_dir, step, self.attempt, at=now)
        except OSError as exc:
            _say(f"cannot record progress in {self.checkpoint_dir}: {exc}")

    def _due(self, completed: int) -> bool:
        if not self.distributed:
            return True
        if self.agree_every is None:
            if len(self._agree_seconds) < _WARMUP_STEPS:
                return True
            self.agree_every = self._cadence()
        return completed % self.agree_every == 0

    def _cadence(self) -> int:
        """Steps between agreements: all ranks measured the same warm-up and take the largest proposal."""
        step = sorted(self._step_seconds)[len(self._step_seconds) // 2] if self._step_seconds else 1.0
        check = sorted(self._agree_seconds)[len(self._agree_seconds) // 2]
        wanted = max(1, math.ceil(check / (_CHECK_COST * max(step, 1e-9))))
        bound = max(1, int(_CHECK_LATENCY_SECONDS / max(step, 1e-9)))
        proposal = _collective_tensor("cadence").fill_(float(min(wanted, bound)))
        dist.all_reduce(proposal, op=dist.ReduceOp.MAX)
        return int(proposal.item())

    def agree(self) -> bool:
        """Whether any rank has a notice: the ranks' flags, all-reduced with MAX (every rank must call it)."""
        local = 1.0 if self.signalled is not None else 0.0
        if not self.distributed:
            return bool(local)
        started = time.perf_counter()
        self._flag.fill_(local)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        if not self._fixed_cadence and len(self._agree_seconds) < _WARMUP_STEPS:
            self._agree_seconds.append(time.perf_counter() - started)
        return bool(self._flag.item())

    def notice_now(self) -> Notice:
        """The notice this process acts on: the notice file's, else one from the signal and the grace.

        Under Slurm the signal reaches every process of the job's steps at once, the ranks as early as
        the entrypoint that writes the notice (a preemption's reason and deadline come from asking Slurm),
        so a rank waits a moment for that file before assuming the grace; one assumed is replaced by the
        file's as soon as the file is there (the save checks the deadline again before keeping it).
        """
        if self.notice is None or self._notice_assumed:
            signum, at = self.signalled or (signal.SIGTERM, time.time())
            given = self._notice_file(at, wait=self.notice is None)
            if given is not None:
                self.notice, self._notice_assumed = given, False
            elif self.notice is None:
                reason = "interrupted" if signum == signal.SIGINT else "terminated"
                grace = grace_seconds(os.environ)
                self.notice = Notice(reason, at, at + grace,
                                     f"{signal.Signals(signum).name} with no notice file, grace {grace:g}s")
                self._notice_assumed = True
        return self.notice

    @staticmethod
    def _notice_file(at: float, wait: bool) -> Notice | None:
        """The notice file's notice (not one left from long ago); in a Slurm job, ``wait`` waits a little for it."""
        waited = min(_SLURM_NOTICE_WAIT_SECONDS, grace_seconds(os.environ) / 4) if wait and TIMES_ENV in os.environ else 0
        until = time.monotonic() + waited
        while True:
            given = current_notice(os.environ, not_before=0.0)
            if given is not None and given.deadline >= at - 3600:
                return given
            if time.monotonic() >= until:
                return None
            time.sleep(0.05)

    def _stop(self, completed: int) -> None:
        notice = self.notice_now() if self.signalled is not None else None
        where = self._shard_wise()
        if where is not None or self.rank == self.saving_rank:  # the ranks that save: all, shard by shard, or one
            # another rank had the notice: this node's notice file may hold it, else its grace applies
            self.notice = notice or current_notice(os.environ) or Notice(
                "terminated", time.time(), time.time() + grace_seconds(os.environ), "another rank's notice")
            if self.rank == self.saving_rank:
                _say(f"notice ({self.notice.reason}, {self.notice.seconds_left():.1f}s left): all ranks stop after "
                     f"step {completed}")
            if where is not None:
                self.save_shards(completed, "notice", where)
            else:
                self.save(completed, "notice")
        signum = self.signalled[0] if self.signalled is not None else signal.SIGTERM
        raise Stopped(128 + signum)

    # ---- saving --------------------------------------------------------------------------------------
    def checkpoint_name(self, step: int) -> str:
        return self.name.format(step=step)

    def save(self, step: int, kind: str, failure: str | None = None, failed_at: float | None = None) -> Path | None:
        """Save ``step`` atomically and acknowledge it; the checkpoint's path, or None when it was not saved."""
        name = self.checkpoint_name(step)
        if self._already_saved(name, step, answers_notice=kind == "notice"):
            return self.checkpoint_dir / name
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.checkpoint_dir / f".{name}.{os.getpid()}.tmp"
        try:
            self._save_fn(step, temporary)
            _fsync_tree(temporary)
            # a notice may have come during the save (the launcher's SIGTERM to survivors): its deadline holds
            notice = self.notice_now() if self.signalled is not None else self.notice
            if notice is not None and time.time() > notice.deadline:
                late = time.time() - notice.deadline
                _say(f"{kind.replace('_', '-')} checkpoint of step {step} was ready {late:.1f}s after the notice's "
                     f"deadline; discarded, so nothing half-trusted is left")
                _remove(temporary)
                return None
        except BaseException:
            _remove(temporary)
            raise
        return self._put_in_place(temporary, name, step, kind, failure, failed_at)

    def _put_in_place(self, made: Path, name: str, step: int, kind: str, failure: str | None,
                      failed_at: float | None) -> Path:
        """``made`` (a whole save under its dot-name) renamed to ``name`` and acknowledged; its path."""
        final = self.checkpoint_dir / name
        try:
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)
            os.replace(made, final)
            shards.fsync_dir(self.checkpoint_dir)
        except BaseException:
            _remove(made)
            raise
        self._acknowledge(name, step, kind, failure, failed_at)
        if kind != "periodic":
            self._progress(step, time.time())
        return final

    def _acknowledge(self, name: str, step: int, kind: str, failure: str | None, failed_at: float | None,
                     files: tuple[acks.AckFile, ...] | None = None) -> None:
        written = time.time()
        notice = self.notice
        ack = acks.Ack(
            checkpoint=name, step=step, kind=kind, files=files if files is not None else acks.describe_files(self.checkpoint_dir, name),
            saved_by_rank=self.rank, world_size=self.world_size, written_at=written,
            notice=notice.to_json() if notice is not None and kind == "notice" else None,
            seconds_from_notice=round(written - notice.given_at, 3) if notice is not None and kind == "notice" else None,
            failure=failure, seconds_from_failure=round(written - failed_at, 3) if failed_at is not None else None,
        )
        acks.write_ack(self.checkpoint_dir, ack)
        if kind != "periodic":
            since = ack.seconds_from_notice if kind == "notice" else ack.seconds_from_failure
            _say(f"{kind.replace('_', '-')} checkpoint {name} (step {step}) saved by rank {self.rank}, "
                 f"acknowledged {since}s after the {'notice' if kind == 'notice' else 'failure'}")

    # ---- sharded state, shard by shard ---------------------------------------------------------------
    def _already_saved(self, name: str, step: int, answers_notice: bool = False) -> bool:
        """Whether ``step`` is saved and acknowledged already: a periodic save of the same step.

        A notice whose agreed step was just saved periodically is answered by that checkpoint: with
        ``answers_notice`` (the rank that acknowledges a notice's save), its acknowledgement is rewritten
        as the notice's (the same files, the notice and the seconds since it), so the verdict still has
        its notice → acknowledgement time, and the progress record says the step.
        """
        existing = acks.read_ack(self.checkpoint_dir, name)
        if existing is None or existing.step != step or acks.verify(self.checkpoint_dir, existing) is not None:
            return False
        if answers_notice and existing.kind == "periodic":
            self._acknowledge(name, step, "notice", None, None, existing.files)
            self._progress(step, time.time())
        return True

    def save_shards(self, step: int, kind: str, where: shards.Layout) -> Path | None:
        """Save ``step`` of sharded state with every rank alive (every rank calls it): the first replica's
        ranks write their shards, two barriers apart, and its lowest rank puts the folder in place."""
        assert self.model is not None
        name = self.checkpoint_name(step)
        members = where.replicas[0]
        if self._already_saved(name, step, answers_notice=kind == "notice" and self.rank == min(members)):
            return self.checkpoint_dir / name
        folder = self.checkpoint_dir / f".{name}.{kind}-{self.attempt or 'attempt'}.tmp"
        if self.rank == min(members):
            _remove(folder)  # an earlier save of this step that never finished
        if self.distributed:
            dist.barrier()
        shard = where.shard_of(self.rank)
        if self.rank in members and shard is not None:
            shards.write_shard(folder, shards.shard_state(self.model, self.optimizer, step, where, shard))
        if self.distributed:
            dist.barrier()
        if self.rank != min(members):
            return None
        deadline = self.notice.deadline if self.notice is not None and kind == "notice" else time.time()
        return self._assemble(folder, step, kind, where, members, deadline)

    def _assemble(self, folder: Path, step: int, kind: str, where: shards.Layout, members: tuple[int, ...],
                  deadline: float, failure: str | None = None, failed_at: float | None = None) -> Path | None:
        """Once every shard is in ``folder`` (waited for until ``deadline``): the manifest, the folder renamed
        into place and acknowledged; else the folder removed, so nothing that looks whole is left."""
        try:
            missing = shards.wait_for_shards(folder, where.shards, deadline, _say)
            if missing:
                ranks = [members[k] for k in missing]
                self._give_up(folder, step, kind, (
                    f"shard{'s' if len(missing) > 1 else ''} {missing} (rank{'s' if len(ranks) > 1 else ''} "
                    f"{', '.join(map(str, ranks))}) not written by the deadline; nothing kept"))
                return None
            shards.write_manifest(folder, step, where, members)
            _fsync_tree(folder)
            if time.time() > deadline and kind != "periodic":
                self._give_up(folder, step, kind, f"ready {time.time() - deadline:.1f}s after the deadline; "
                              "discarded, so nothing half-trusted is left")
                return None
        except BaseException:
            _remove(folder)
            raise
        return self._put_in_place(folder, self.checkpoint_name(step), step, kind, failure, failed_at)

    def _give_up(self, folder: Path, step: int, kind: str, why: str) -> None:
        """``folder`` removed, and why said: a just-in-time save's refusal is recorded for the verdict."""
        _remove(folder)
        if kind == "just_in_time":
            self._keep_in_claim(why)
            self._refuse(step, why)
        else:
            _say(f"{kind.replace('_', '-')} checkpoint of step {step}: {why}")

    def _just_in_time_shards(self, where: shards.Layout, step: int, failure: str, failed_at: float) -> Path | None:
        """HSDP after a peer died: write this rank's shard into its replica's folder and leave, unless it
        completed the replica; then claim the just-in-time save and put that replica's folder in place.

        No survivor waits for another: a survivor blocked in a collective with another survivor (not
        with the rank that died) fails only when that one's process ends, so each writes and goes.
        """
        assert self.model is not None
        notice = self.notice_now() if self.signalled is not None else None
        deadline = failed_at + grace_seconds(os.environ)
        if notice is not None:
            deadline = min(deadline, notice.deadline)
        replica, shard = where.replica_of(self.rank), where.shard_of(self.rank)
        if replica is None or shard is None:
            self._refuse(step, f"rank {self.rank} is not on the model's mesh ({where.describe()})")
            return None
        name = self.checkpoint_name(step)
        if self._already_saved(name, step):
            return self.checkpoint_dir / name
        if self._claim_path().exists():  # learnt of the failure late: a whole replica is being saved already
            _say(f"rank {self.rank} stands down without writing its shard: another replica's just-in-time "
                 f"checkpoint is claimed")
            return None
        folder = self._replica_folder(name, replica)
        try:
            shards.write_shard(folder, shards.shard_state(self.model, self.optimizer, step, where, shard))
        except Exception as error:
            _say(f"rank {self.rank} could not write shard {shard} of step {step}: {type(error).__name__}: {error}")
        if shards.missing_shards(folder, where.shards):
            self._stand_down(folder, step, where, replica, shard)
            return None
        if not self._claim({"rank": self.rank, "replica": replica, "step": step, "at": failed_at}):
            _say(f"rank {self.rank} stands down: another replica's just-in-time checkpoint is claimed")
            _remove(folder)
            return None
        _say(f"rank {self.rank} completed replica {replica}'s shards of step {step} after: {failure}")
        try:
            saved = self._assemble(folder, step, "just_in_time", where, where.replicas[replica], deadline,
                                   failure=failure, failed_at=failed_at)
        except Exception as error:
            _say(f"just-in-time checkpoint of step {step} failed: {type(error).__name__}: {error}")
            return None
        if saved is not None:
            self._refusal_path().unlink(missing_ok=True)  # a replica's stand-down spoke too early
            for other in self.checkpoint_dir.glob(self._replica_folder(name, "*").name):
                _remove(other)
        return saved

    def _stand_down(self, folder: Path, step: int, where: shards.Layout, replica: int, shard: int) -> None:
        """This survivor's replica is not whole yet: its shard stays for the one that completes it, unless
        another replica is claimed already (then the shard is of no use and goes)."""
        if self._claim_path().exists():
            _say(f"rank {self.rank} stands down: another replica's just-in-time checkpoint is claimed")
            _remove(folder / shards.shard_file(shard, where.shards))
            try:
                folder.rmdir()
            except OSError:
                pass
            return
        _say(f"rank {self.rank} wrote shard {shard} of replica {replica} (step {step}) and stands down: "
             f"shards {shards.missing_shards(folder, where.shards)} of that replica are not written yet")
        self._refuse_unless_claimed(step, where, self.checkpoint_name(step))

    def _refuse_unless_claimed(self, step: int, where: shards.Layout, name: str) -> None:
        """Record why there is no just-in-time checkpoint as this survivor sees it, unless a replica is being
        saved; removed again when one was saved meanwhile, so a record never stands beside the checkpoint
        it denies (the saver removes it too, once its acknowledgement is written)."""
        if self._claim_path().exists():
            return
        seen = []
        for index in range(min(len(where.replicas), 8)):
            missing = shards.missing_shards(self._replica_folder(name, index), where.shards)
            lost = [where.replicas[index][k] for k in missing]
            seen.append(f"replica {index} lacks the shard{'s' if len(lost) > 1 else ''} of rank"
                        f"{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))}" if lost else
                        f"replica {index} is whole")
        if len(where.replicas) > len(seen):
            seen.append(f"{len(where.replicas) - len(seen)} more replicas not looked at")
        self._refuse(step, f"no replica of every shard survived ({where.describe()}): {'; '.join(seen)}")
        claim = read_json_object(self._claim_path())  # claimed since this survivor looked: that claimer's
        if claim is not None and isinstance(claim.get("refused"), str):  # reason is the one that counts
            self._refuse(step, claim["refused"], quiet=True)
        if acks.read_ack(self.checkpoint_dir, name) is not None:  # saved meanwhile
            self._refusal_path().unlink(missing_ok=True)

    def _replica_folder(self, name: str, replica: int | str) -> Path:
        """Where survivors of ``replica`` write their shards of checkpoint ``name`` (``"*"``: a glob of them all)."""
        return self.checkpoint_dir / f".{name}.jit-{self.attempt or 'attempt'}-replica{replica}.tmp"

    def _claim_path(self) -> Path:
        return acks.acks_folder(self.checkpoint_dir) / f"just-in-time-{self.attempt or 'attempt'}.claim"

    def _claim(self, record: dict[str, object]) -> bool:
        """Claim this attempt's just-in-time save (``O_EXCL``: one survivor wins), leaving ``record`` in the
        claim; False when another survivor claimed it first."""
        claim = self._claim_path()
        try:
            claim.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record) + "\n")
        return True

    def _keep_in_claim(self, why: str) -> None:
        """The claimer's reason for keeping nothing, kept in its claim too: a survivor that stood down
        may overwrite the record with its own earlier view, and puts this reason back when it sees it."""
        record = read_json_object(self._claim_path()) or {}
        try:
            write_json_atomic(self._claim_path(), {**record, "refused": why})
        except OSError as exc:
            _say(f"cannot record why in the claim: {exc}")

    def _refusal_path(self) -> Path:
        return acks.acks_folder(self.checkpoint_dir) / f"no-just-in-time-{self.attempt or 'attempt'}.json"

    # ---- a peer died ---------------------------------------------------------------------------------
    def just_in_time(self, exc: BaseException) -> Path | None:
        """After a peer's death made a collective fail: one survivor saves the last completed step."""
        failed_at = time.time()
        failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]
        step = self.completed
        if step is None or step == self.resumed_from or step == 0:
            _say(f"no just-in-time checkpoint: no step completed since the start ({failure})")
            return None
        if self.rank == self.saving_rank:
            self._progress(step, failed_at)
        where = self.layout()
        if isinstance(where, shards.Layout):
            if self._own_save:
                self._refuse(step, f"the state is sharded ({where.describe()}) and the loop saves it with its own "
                                   f"save function, which no survivor can call alone")
                return None
            if where.fully_sharded:
                self._refuse(step, f"the state is {where.describe()}: no survivor holds a replica of every shard")
                return None
            return self._just_in_time_shards(where, step, failure, failed_at)
        if where is not None or sharded(self.model):
            self._refuse(step, f"the state is sharded (FSDP) in a layout the guard does not save shard by shard"
                               f"{f' ({where})' if where else ''}: no survivor holds a replica of every shard")
            return None
        if self.signalled is not None:
            self.notice_now()  # the launcher's SIGTERM to the survivors: its deadline bounds the save
        time.sleep(min(self.rank, 50) * 0.02)  # lower ranks claim first; the claim itself decides
        if not self._claim({"rank": self.rank, "step": step, "at": failed_at}):
            _say(f"rank {self.rank} stands down: another survivor saves the just-in-time checkpoint")
            return None
        _say(f"rank {self.rank} saves a just-in-time checkpoint of step {step} after: {failure}")
        try:
            return self.save(step, "just_in_time", failure=failure, failed_at=failed_at)
        except Exception as error:
            _say(f"just-in-time checkpoint of step {step} failed: {type(error).__name__}: {error}")
            return None

    def _refuse(self, step: int, why: str, *, quiet: bool = False) -> None:
        """Record why there is no just-in-time checkpoint of ``step`` (said on stderr unless ``quiet``)."""
        if not quiet:
            _say(f"no just-in-time checkpoint of step {step}: {why}")
        record = {"version": 1, "attempt": self.attempt, "step": step, "reason": why, "at": time.time()}
        try:
            write_json_atomic(self._refusal_path(), record)
        except OSError as exc:
            _say(f"cannot record why: {exc}")
