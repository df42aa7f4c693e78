"""A small FSDP2 training on gloo: one launcher process imports torch once and forks the ranks.

``python fsdp_job.py <config.json>``: the config is a list of runs, one after the other. A run:
``out`` (folder for what the ranks record),
``world``, ``mesh`` ([replicas, shards] for HSDP, [shards] for fully sharded), ``steps``,
``checkpoint_dir``, optional ``resume`` (a checkpoint), ``die`` ({"rank", "at_step"}: that rank is
SIGKILLed at the start of that step, the steps before it completed), ``die_in_save`` (a rank
SIGKILLed halfway through writing its shard), ``notice`` ({"rank", "at_step"}: that rank sends
itself SIGTERM in that step), ``every`` (periodic checkpoints), ``grace`` (seconds). Each rank records its local state
(model and optimizer shards) as ``<what>-<rank>.pt``: ``before`` the death, ``resumed`` just after a
resume, ``final`` at the end; the launcher writes the ranks' exit codes to ``exits.json`` in ``out``.

Forked from one process, four ranks start in seconds on two cores where four interpreters importing
torch take most of a minute. There is no launcher between the ranks, so a survivor learns of the
death from gloo alone.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # noqa: F401  (FSDP2's first call imports it: once here, not in every rank)
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def local_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    def plain(value: Any) -> Any:
        if isinstance(value, DTensor):
            return value.to_local().detach().clone()
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    return {"model": {k: plain(v) for k, v in model.state_dict().items()},
            "optimizer": {i: {k: plain(v) for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()}}


def rank_main(rank: int, config: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT))
    import trainguard_train as tg
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    out = Path(config["out"])
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=config["world"], timeout=timedelta(seconds=60))
    names = ("replicate", "shard") if len(config["mesh"]) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", tuple(config["mesh"]), mesh_dim_names=names)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    replica = mesh.get_coordinate()[0] if len(config["mesh"]) == 2 else 0  # type: ignore[index]
    die, notice = config.get("die") or {}, config.get("notice") or {}
    with tg.Guard(model, optimizer, every=config.get("every")) as guard:
        first = guard.resume()
        if config.get("resume"):
            torch.save(local_state(model, optimizer), out / f"resumed-{rank}.pt")
        for step in guard.steps(first, config["steps"]):
            if step == die.get("at_step"):
                torch.save(local_state(model, optimizer), out / f"before-{rank}.pt")
                if rank == config.get("die_in_save"):
                    _die_halfway_through_the_next_save()
                if rank == die.get("rank"):
                    os.kill(os.getpid(), signal.SIGKILL)
            if step == notice.get("at_step") and rank == notice.get("rank"):
                os.kill(os.getpid(), signal.SIGTERM)
            torch.manual_seed(1000 * step + replica)
            loss = model(torch.randn(4, 8)).pow(2).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    torch.save(local_state(model, optimizer), out / f"final-{rank}.pt")
    dist.destroy_process_group()


def _die_halfway_through_the_next_save() -> None:
    """The next torch.save into a file (the shard) writes part of its bytes, then the process is SIGKILLed."""
    real = torch.save

    def halfway(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if hasattr(f, "write"):
            f.write(b"PK\x03\x04 half a shard")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real(obj, f, *args, **kwargs)

    torch.save = halfway  # type: ignore[assignment]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(config: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(config["world"]),
                      TRAINGUARD_CHECKPOINT_DIR=config["checkpoint_dir"], TRAINGUARD_ATTEMPT=str(config["attempt"]),
                      TRAINGUARD_NOTICE_GRACE_SECONDS=str(config.get("grace", 30)))
    os.environ.pop("TRAINGUARD_RESUME_FROM", None)
    if config.get("resume"):
        os.environ["TRAINGUARD_RESUME_FROM"] = config["resume"]
    Path(config["out"]).mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=rank_main, args=(rank, config)) for rank in range(config["world"])]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=240)
    exits = [process.exitcode for process in ranks]
    for process in ranks:
        if process.exitcode is None:
            process.kill()
    (Path(config["out"]) / "exits.json").write_text(json.dumps(exits))


def main() -> None:
    for config in json.loads(Path(sys.argv[1]).read_text()):
        launch(config)


if __name__ == "__main__":
    main()
