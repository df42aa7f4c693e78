"""Sharded state (FSDP2's DTensor parameters) saved shard by shard, and loaded back into each rank's shard.

A model sharded with ``torch.distributed.fsdp.fully_shard`` holds DTensor parameters on a device mesh:
a 1-D mesh shards every parameter over all ranks (no replica), a 2-D mesh ``("replicate", "shard")``
is HSDP: each row of the mesh is one replica of the whole state, its ranks holding one shard each.

A sharded checkpoint is a folder: ``shard-<k>-of-<n>.pt`` for every shard ``k`` (the shard's model
and optimizer tensors, local to the rank that wrote it) and ``manifest.json`` (step, mesh shape,
shard files), written last. One replica's ranks write their shards into a dot-named folder (each
shard under a dot-name of its own, fsynced and renamed); once every shard file is there, one rank
(`trainguard_train.guard` says which) writes the manifest and renames the folder into place. A
folder without its manifest or a shard is never loaded. A run on another mesh loads it too
(`load_shard`): each sharded tensor joined whole from the saved shards and cut anew.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainguard_entrypoint.files import read_json_object, write_json_atomic

MANIFEST = "manifest.json"
SHARD_FORMAT = 1
_POLL_SECONDS = 0.02
_SHOWN = 8  # replicas named in a reason; the rest counted
_SAY_EVERY_SECONDS = 2.0


@dataclass(frozen=True)
class Layout:
    """How the state is sharded: the mesh's shape and its replicas (each a tuple of ranks, in shard order)."""

    mesh_shape: tuple[int, ...]
    replicas: tuple[tuple[int, ...], ...]

    @property
    def fully_sharded(self) -> bool:
        return len(self.replicas) == 1

    @property
    def shards(self) -> int:
        return len(self.replicas[0])

    def replica_of(self, rank: int) -> int | None:
        return next((i for i, ranks in enumerate(self.replicas) if rank in ranks), None)

    def shard_of(self, rank: int) -> int | None:
        replica = self.replica_of(rank)
        return None if replica is None else self.replicas[replica].index(rank)

    def describe(self) -> str:
        if self.fully_sharded:
            return f"fully sharded (FSDP) over {self.shards} ranks, no replica"
        shown = ", ".join(str(list(r)) for r in self.replicas[:_SHOWN])
        more = f" and {len(self.replicas) - _SHOWN} more" if len(self.replicas) > _SHOWN else ""
        return f"HSDP, {len(self.replicas)} replicas of {self.shards} shards: {shown}{more}"


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def _is_dtensor(value: object) -> bool:
    kind = _dtensor_type()
    return kind is not None and isinstance(value, kind)


def layout(model: torch.nn.Module | None) -> Layout | str | None:
    """The model's `Layout`; None when no parameter is a DTensor; a string saying why when the
    layout is one this module does not save shard by shard."""
    if model is None:
        return None
    found = [p for p in model.parameters() if _is_dtensor(p)]
    if not found:
        return None
    meshes = {id(p.device_mesh) for p in found}  # type: ignore[attr-defined]
    first: Any = found[0]
    mesh, placements = first.device_mesh, tuple(first.placements)
    if len(meshes) > 1 or any(tuple(p.placements) != placements for p in found):  # type: ignore[attr-defined]
        return "its parameters lie on more than one mesh or placement"
    ranks = mesh.mesh.tolist()
    if mesh.mesh.dim() == 1 and placements[0].is_shard():
        return Layout((len(ranks),), (tuple(int(r) for r in ranks),))
    if mesh.mesh.dim() == 2 and placements[0].is_replicate() and placements[1].is_shard():
        return Layout(tuple(mesh.mesh.shape), tuple(tuple(int(r) for r in row) for row in ranks))
    return f"mesh {tuple(mesh.mesh.shape)} with placements {placements} is neither FSDP nor HSDP"


def shard_file(shard: int, shards: int) -> str:
    return f"shard-{shard:05d}-of-{shards:05d}.pt"


# ---- one rank's shard ---------------------------------------------------------------------------------
def _local(value: Any) -> Any:
    if _is_dtensor(value):
        return value.to_local().detach().clone()
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def shard_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, step: int,
                where: Layout, shard: int) -> dict[str, Any]:
    """This rank's part of the state: local tensors only, and which optimizer entries were DTensors."""
    state: dict[str, Any] = {"format": SHARD_FORMAT, "step": step, "mesh_shape": list(where.mesh_shape),
                             "shard": shard, "shards": where.shards,
                             "model": {k: _local(v) for k, v in model.state_dict().items()}}
    if optimizer is not None:
        saved = optimizer.state_dict()
        state["optimizer"] = {"param_groups": saved["param_groups"],
                              "state": {i: {k: _local(v) for k, v in s.items()} for i, s in saved["state"].items()}}
        state["optimizer_dtensors"] = sorted([i, k] for i, s in saved["state"].items()
                                             for k, v in s.items() if _is_dtensor(v))
    return state


def write_shard(folder: Path, state: dict[str, Any]) -> Path:
    """Write one shard into ``folder`` (made if missing) under a dot-name, fsync it, rename it into place."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / shard_file(int(state["shard"]), int(state["shards"]))
    partial = folder / f".{final.name}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, final)
        fsync_dir(folder)
    except BaseException:
        try:
            partial.unlink()
        except OSError:
            pass
        raise
    return final


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def missing_shards(folder: Path, shards: int) -> list[int]:
    return [k for k in range(shards) if not (folder / shard_file(k, shards)).is_file()]


def wait_for_shards(folder: Path, shards: int, deadline: float, say: Any) -> list[int]:
    """Wait until every shard file is in ``folder`` or ``deadline`` (unix time) passes; the shards missing then."""
    next_word = time.monotonic() + _SAY_EVERY_SECONDS
    while True:
        missing = missing_shards(folder, shards)
        if not missing or time.time() >= deadline:
            return missing
        if time.monotonic() >= next_word:
            next_word = time.monotonic() + _SAY_EVERY_SECONDS
            say(f"waiting for shards {missing} of {shards} ({deadline - time.time():.1f}s left before the deadline)")
        time.sleep(_POLL_SECONDS)


def write_manifest(folder: Path, step: int, where: Layout, ranks: Iterable[int]) -> None:
    write_json_atomic(folder / MANIFEST, {
        "format": SHARD_FORMAT, "step": step, "mesh_shape": list(where.mesh_shape), "shards": where.shards,
        "files": [shard_file(k, where.shards) for k in range(where.shards)], "saved_by_ranks": list(ranks)})


def load_shard(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, where: Layout,
               rank: int) -> int:
    """Load this rank's shard of the sharded checkpoint ``path``; its step.

    Saved with as many shards as this run has (whatever its replicas: each holds the whole state), the
    rank reads its own shard file. Saved with another number of shards (a mesh that shrank or grew),
    every rank reads every shard file, joins each sharded tensor whole (a whole replica's state in the
    rank's memory, for as long as the load takes) and keeps its own piece of it on this run's mesh.

    Raises:
        ValueError: (one line) ``path`` is not a whole sharded checkpoint, or does not fit this model.
    """
    field = f"TRAINGUARD_RESUME_FROM={path}"
    step, saved = _whole_checkpoint(path, field)
    shard = where.shard_of(rank)
    if shard is None:
        raise ValueError(f"{field}: rank {rank} is not on the model's mesh; resume with the same ranks")
    whole = saved != where.shards
    states = _read_shards(path, step, saved, range(saved) if whole else [shard], field)
    current = model.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]] if optimizer is not None else []
    names, expected = set(states[0]["model"]), set(current)
    if names != expected:
        odd = sorted(names ^ expected)
        raise ValueError(f"{field}: saved for a model with other parameters ({', '.join(odd[:3])}"
                         f"{f' and {len(odd) - 3} more' if len(odd) > 3 else ''}); resume with the model it was saved from")
    state = _joined(states, current, params, field) if whole else states[0]
    _load_model(model, current, state["model"], whole)
    if optimizer is not None and state.get("optimizer") is not None:
        _load_optimizer(optimizer, params, state["optimizer"],
                        {(int(i), str(k)) for i, k in state.get("optimizer_dtensors", [])}, whole)
    return int(state["step"])


def _whole_checkpoint(path: Path, field: str) -> tuple[object, int]:
    """The step and the number of shards of the sharded checkpoint ``path``, once its manifest and every
    shard file are there; else a one-line ValueError."""
    manifest = read_json_object(path / MANIFEST) if path.is_dir() else None
    if manifest is None or manifest.get("format") != SHARD_FORMAT:
        raise ValueError(f"{field}: not a whole sharded checkpoint (no readable {MANIFEST}); "
                         f"resume from a folder the guard saved for this sharded model")
    listed = manifest.get("shards")
    saved = listed if isinstance(listed, int) and listed > 0 else 0
    missing = missing_shards(path, saved) if saved else ["all"]
    if missing:
        raise ValueError(f"{field}: shards {missing} of {listed} are missing; resume from a complete checkpoint")
    return manifest.get("step"), saved


def _read_shards(path: Path, step: object, saved: int, wanted: Iterable[int], field: str) -> list[dict[str, Any]]:
    states = []
    for k in wanted:
        state = torch.load(path / shard_file(k, saved), map_location="cpu", weights_only=False)
        if state.get("shard") != k or state.get("step") != step:
            raise ValueError(f"{field}: {shard_file(k, saved)} is not shard {k} of step {step}; "
                             f"resume from a checkpoint the guard saved")
        states.append(state)
    return states


def _joined(states: list[dict[str, Any]], current: dict[str, Any], params: list[Any], field: str) -> dict[str, Any]:
    """The saved shards as one state: each tensor that is sharded on this model (its state dict
    ``current``, its optimizer's ``params``) joined whole along its shard dimension, in shard order;
    everything else as shard 0 has it."""
    first = states[0]
    joined: dict[str, Any] = {**first, "model": {}}
    for key, value in first["model"].items():
        reference = current.get(key)
        joined["model"][key] = _whole(key, [s["model"][key] for s in states], reference, field) \
            if _is_dtensor(reference) else value
    if params and first.get("optimizer") is not None:
        sharded = {(int(i), str(k)) for i, k in first.get("optimizer_dtensors", [])}
        joined["optimizer"] = {"param_groups": first["optimizer"]["param_groups"], "state": {
            i: {k: _whole(f"optimizer state {i}.{k}", [s["optimizer"]["state"][i][k] for s in states], params[int(i)],
                          field) if (int(i), k) in sharded else v for k, v in entry.items()}
            for i, entry in first["optimizer"]["state"].items()}}
    return joined


def _whole(name: str, pieces: list[torch.Tensor], reference: Any, field: str) -> torch.Tensor:
    dims = [placement.dim for placement in reference.placements if placement.is_shard()]
    whole = torch.cat(pieces, dim=dims[0] if dims else 0)
    if tuple(whole.shape) != tuple(reference.shape):
        raise ValueError(f"{field}: {name} joined from its shards is {tuple(whole.shape)}, this model's is "
                         f"{tuple(reference.shape)}; resume with the model it was saved from")
    return whole


def _like(local: torch.Tensor, reference: Any) -> Any:
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(local, reference.device_mesh, reference.placements, run_check=False,
                              shape=reference.shape, stride=reference.stride())


def _placed(value: torch.Tensor, reference: Any, whole: bool) -> Any:
    """``value`` as a DTensor like ``reference``: a local piece as it is, a whole tensor cut to this rank's piece."""
    if not whole:
        return _like(value, reference)
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(value, reference.device_mesh, reference.placements, src_data_rank=None)  # no collective


def _load_model(model: torch.nn.Module, current: dict[str, Any], saved: dict[str, Any], whole: bool) -> None:
    model.load_state_dict({k: _placed(saved[k], v, whole) if _is_dtensor(v) else saved[k] for k, v in current.items()})


def _load_optimizer(optimizer: torch.optim.Optimizer, params: list[Any], saved: dict[str, Any],
                    dtensors: set[tuple[int, str]], whole: bool) -> None:
    state = {int(i): {k: _placed(v, params[int(i)], whole) if (int(i), k) in dtensors else v for k, v in entry.items()}
             for i, entry in saved["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
